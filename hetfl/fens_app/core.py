"""FENS: the ensemble as one model for inference (the members through the trained aggregator).

The split, the members and their logits are the one-shot machinery's (:mod:`hetfl.common.oneshot.ensemble`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from hetfl.common.oneshot.ensemble import build_members


class EnsemblePredictor(nn.Module):
    """The FENS model for inference: every member's logits (N, M, C) through the trained aggregator (N, C)."""

    def __init__(self, members: Sequence[nn.Module], aggregator: nn.Module) -> None:
        super().__init__()
        self.members, self.aggregator = nn.ModuleList(members), aggregator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.aggregator(torch.stack([m(x).float() for m in self.members], dim=1))


def inference_model(cfg: dict[str, Any], tensors: dict[str, np.ndarray]) -> nn.Module:
    """Builder of the final model file (docs/inference.md): members ``m<j>.*`` and the aggregator ``agg.*``."""
    from hetfl.common.final_model import split_members
    from hetfl.common.rundata import num_classes

    from .aggregators import make_aggregator

    members = build_members(cfg, split_members(tensors), quantized=False)
    M, C = len(members), num_classes(cfg)
    # placeholder statistics: a static aggregator's weights are buffers, loaded from the file below
    agg = make_aggregator(cfg["fens-aggregator"], M, C, cfg["fens-aggregator-hidden"], label_counts=np.ones((M, C)),
                          confusion=np.ones((M, C, C)))
    agg.load_state_dict({k[4:]: torch.from_numpy(np.array(v)) for k, v in tensors.items() if k.startswith("agg.")})
    return EnsemblePredictor(members, agg)
