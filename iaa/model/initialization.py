"""The paper's initialisation ("Training Details"): weights ~ N(0, 0.05), GRU recurrent weights
orthogonal, biases zero."""

from __future__ import annotations

import torch
from torch import nn

INIT_STD = 0.05


def orthogonal_blocks_(weight: torch.Tensor, hidden: int) -> torch.Tensor:
    """Each (hidden x hidden) gate block of a stacked recurrent matrix (3h, h) is orthogonal."""
    with torch.no_grad():
        for block in weight.split(hidden, 0):
            nn.init.orthogonal_(block)
    return weight


def init_reader_(module: nn.Module) -> None:
    """Initialise every parameter of ``module`` in place, by name.

    ``weight_hh*`` (nn.GRU / nn.GRUCell recurrent matrices) -> orthogonal per gate block;
    ``bias*`` -> 0; everything else (embedding, input weights, linear maps) -> N(0, 0.05).
    """
    for name, param in module.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.startswith("weight_hh"):
            orthogonal_blocks_(param, param.shape[1])
        elif leaf.startswith("bias"):
            nn.init.zeros_(param)
        else:
            nn.init.normal_(param, 0.0, INIT_STD)
