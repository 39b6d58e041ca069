"""``iaa-cli``: prepare data, train, evaluate, tune, ensemble and benchmark the IAA reader.

Each command parses flags, builds the adapters the job needs (the one composition step,
:mod:`iaa.cli.adapters`) and calls one job; heavy imports happen inside commands so that
``iaa-cli --help`` stays instant. One module per command group:

- :mod:`~iaa.cli.group`: the group, ``--version``, ``--debug`` and :func:`main` (the console script);
- :mod:`~iaa.cli.options`: the options and parameter types shared by several commands;
- :mod:`~iaa.cli.output`: results, warnings, and expected errors as one line;
- :mod:`~iaa.cli.data`: ``prepare``, ``make-cloze``;
- :mod:`~iaa.cli.training`: ``train``, ``bench``;
- :mod:`~iaa.cli.tuning`: ``tune``;
- :mod:`~iaa.cli.ensembles`: ``ensemble``, ``distill``;
- :mod:`~iaa.cli.inference`: ``evaluate``, ``baseline``, ``explain``, ``predict``, ``serve``;
- :mod:`~iaa.cli.reports`: ``report``.

The group, every command and :func:`serve_app` (``import_path: iaa.cli:serve_app``) are
importable from this package.
"""

from __future__ import annotations

from iaa.cli.data import make_cloze, prepare
from iaa.cli.ensembles import distill, ensemble
from iaa.cli.inference import baseline, evaluate, explain, predict, serve, serve_app
from iaa.cli.group import cli, main
from iaa.cli.options import (INPUT_FORMATS, MODELS, address_option, cluster_options, config_options, data_options,
                             input_option, json_option, precision_option, tracking_option, workdir_option)
from iaa.cli.reports import report
from iaa.cli.training import bench, train
from iaa.cli.tuning import tune

__all__ = ["INPUT_FORMATS", "MODELS", "address_option", "baseline", "bench", "cli", "cluster_options", "config_options",
           "data_options", "distill", "ensemble", "evaluate", "explain", "input_option", "json_option", "main",
           "make_cloze", "precision_option", "predict", "prepare", "report", "serve", "serve_app", "tracking_option",
           "train", "tune", "workdir_option"]
