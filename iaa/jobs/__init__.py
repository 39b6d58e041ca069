"""Every workflow of iaa, written against the ports (:mod:`iaa.jobs.ports`), never against Ray or MLflow.

Two kinds of sub-package (``docs/architecture.md`` draws them):

- the base, shared by every use case: ``config`` (configs and presets), ``workdir`` (the work
  folder), ``ports``, ``modeling`` (checkpoints, objective, precision), ``evaluation`` (scoring,
  the predictor, explain pages, ensemble averaging), ``training`` (the loop, one step, the
  step captured in CUDA graphs, runs side by side, the session), ``sweeps`` (a sweep's record,
  cost and console), ``datasets`` (preparing and resolving data) and ``interrupt`` (SIGINT and
  SIGTERM: stop at once, mark, say how to resume);
- the use cases, one per command group: ``train``, ``tune``, ``ensemble``, ``distill``,
  ``inference``, ``own_data`` and ``reports``. A use case imports the base and the layers below,
  never another use case (``tests/test_architecture.py``).
"""
