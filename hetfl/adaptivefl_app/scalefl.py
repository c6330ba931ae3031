"""ScaleFL (Ilhan et al., CVPR 2023), the Table 2 baseline of AdaptiveFL, as the AdaptiveFL authors compare against it.

Each level is scaled in width (one ratio for every hidden layer) and in depth (how many early
exits it runs): S1 runs the first exit, M1 the first two, L1 all of them and the model's own
classifier. A submodel's tensors are leading slices of the full model's, so Algorithm 2
aggregates them (parameters a level does not have keep their value). Local training minimises
the exits' cross-entropies weighted 1, 2, .., d (normalised), plus an optional self-distillation
term from the deepest exit (`scalefl-kd`; the authors' comparison runs it at 0).
Everything here is explained in docs/readings.md#adaptivefl-scalefl.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hetfl.common.models import build_model, count_parameters, hidden_widths, pruned_widths

from .core import PoolEntry, SubmodelPool, uniform_ratio
from .keys import DEFAULT_EXITS
SCALEFL_LEVELS = (("S", "S1", 1), ("M", "M1", 2), ("L", "L1", 3))  # type, name, exits run


def exit_positions(body: nn.Sequential, exits: Sequence[int]) -> list[int]:
    """Index into `body` right after the activation that follows hidden layer k (conv or linear), for each k."""
    hidden = [i for i, m in enumerate(body) if isinstance(m, (nn.Conv2d, nn.Linear))][:-1]  # not the output layer
    out = []
    for k in exits:
        if not 1 <= k <= len(hidden):
            raise ValueError(f"scalefl-exits: hidden layer {k} does not exist (the model has {len(hidden)})")
        i = hidden[k - 1]
        out.append(next(j for j in range(i, len(body)) if isinstance(body[j], nn.ReLU)) + 1)
    return out


def _exit_head(classifier: Sequence[nn.Module], inputs: int, pooled: bool) -> nn.Sequential:
    """An early exit: (global average pooling after a conv layer, then) a fresh copy of the classifier layers
    that would follow, the first Linear taking `inputs` (the authors' VGG16 exits: pool, 512-4096-4096-C)."""
    layers: list[nn.Module] = [nn.AdaptiveAvgPool2d(1), nn.Flatten()] if pooled else []
    first = True
    for m in classifier:
        if isinstance(m, nn.Linear):
            layers.append(nn.Linear(inputs if first else m.in_features, m.out_features))
            first = False
        elif not first:
            layers.append(nn.Dropout(m.p) if isinstance(m, nn.Dropout) else type(m)())
    return nn.Sequential(*layers)


class ScaleFLNet(nn.Module):
    """A CNN/VGG with early exits after the given hidden layers, truncated to its first `depth` exits.

    The model's features and classifier form one `body`; ``depth = len(exits) + 1`` is the whole body with
    every exit. :meth:`forward` returns the deepest exit's logits (what is evaluated); :meth:`exit_logits`
    returns every exit's, shallow to deep.
    """

    def __init__(self, model: str, num_classes: int, in_shape: tuple[int, int, int], widths: tuple[int, ...],
                 exits: Sequence[int], depth: int, batch_stats: bool = False) -> None:
        super().__init__()
        if not 1 <= depth <= len(exits) + 1:
            raise ValueError(f"depth {depth} outside [1, {len(exits) + 1}]")
        base = build_model(model, num_classes, in_shape, widths=widths, batch_stats=batch_stats)
        if not isinstance(getattr(base, "features", None), nn.Sequential) or not hasattr(base, "classifier"):
            raise ValueError(f"ScaleFL needs a features/classifier model (one of {tuple(DEFAULT_EXITS)}), not {model!r}")
        body = nn.Sequential(*base.features, *base.classifier)
        positions = exit_positions(body, exits)
        full = depth == len(exits) + 1
        self.cuts = positions if full else positions[:depth]
        self.body = body if full else body[: self.cuts[-1]]
        n_feat = len(base.features)
        heads = []
        with torch.no_grad():  # the width at each exit (on the meta device when sizes are counted)
            for cut in self.cuts:
                h = body[:cut](torch.zeros(2, *in_shape))
                rest = list(base.classifier) if cut <= n_feat else list(body[cut:])
                heads.append(_exit_head(rest, h.shape[1], pooled=h.dim() == 4))
        self.exits = nn.ModuleList(heads)
        self.full = full

    def exit_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs, start = [], 0
        for cut, head in zip(self.cuts, self.exits, strict=True):
            x = self.body[start:cut](x)
            start = cut
            outs.append(head(x))
        if self.full:
            outs.append(self.body[start:](x))
        return outs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return h if self.full else self.exits[-1](h)


def scalefl_loss(kd: float = 0.0, temperature: float = 3.0):
    """ScaleFL's local loss: sum_j (j + 1) L_j / (d (d + 1) / 2) over the d exits; L_j = CE, plus for every exit
    but the deepest `kd` T^2 KL(softmax(z_d / T) || softmax(z_j / T)) (teacher detached; kd = 0: no distillation)."""

    def loss(model: ScaleFLNet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        outs = [o.float() for o in model.exit_logits(x)]
        d = len(outs)
        teacher = F.softmax(outs[-1].detach() / temperature, dim=1)
        total = outs[-1].new_zeros(())
        for j, z in enumerate(outs):
            term = F.cross_entropy(z, y)
            if kd > 0 and j < d - 1:
                term = term + kd * temperature**2 * F.kl_div(F.log_softmax(z / temperature, dim=1), teacher,
                                                              reduction="batchmean")
            total = total + (j + 1) * term
        return total / (d * (d + 1) / 2)

    return loss


class ScaleFLPool(SubmodelPool):
    """ScaleFL's three levels S1 / M1 / L1: uniform width ratio r and the first 1 / 2 / all exits.

    The S1 and M1 ratios are the largest (in hundredths) whose model fits the given capacities (the weak and
    medium tiers), as for HeteroFL (docs/readings.md#adaptivefl-scalefl).
    """

    def __init__(self, model: str, num_classes: int, in_shape: tuple[int, int, int], capacities: Sequence[float],
                 exits: Sequence[int] | None = None, batch_stats: bool = False) -> None:
        self.model, self.num_classes, self.in_shape = model, num_classes, tuple(in_shape)
        self.batch_stats, self.tau, self.p = batch_stats, 0, 1
        self.full = hidden_widths(model, self.in_shape)
        self.exits = tuple(exits or DEFAULT_EXITS.get(model, ()))
        if len(self.exits) != 2 or list(self.exits) != sorted(set(self.exits)):
            raise ValueError(f"scalefl-exits = {self.exits}: expected two increasing hidden-layer indices")
        entries = []
        for (ty, name, depth), cap in zip(SCALEFL_LEVELS, (*capacities, None), strict=True):
            ratio = 1.0 if cap is None else uniform_ratio(lambda w, d=depth: self.size_of(w, d), self.full, cap, top=100)
            w = pruned_widths(self.full, ratio, 0) if cap is not None else self.full
            entries.append(PoolEntry(name, ty, ratio, 0, w, self.size_of(w, depth), depth))
        self.entries = entries
        self.ratios, self.starts = (entries[1].ratio, entries[0].ratio), (0,)

    def size_of(self, widths: tuple[int, ...], depth: int = 3) -> int:  # type: ignore[override]
        with torch.device("meta"):
            return count_parameters(self._net(widths, depth))

    def _net(self, widths: tuple[int, ...], depth: int) -> ScaleFLNet:
        return ScaleFLNet(self.model, self.num_classes, self.in_shape, widths, self.exits, depth, self.batch_stats)

    def build(self, i: int) -> nn.Module:
        e = self.entries[i]
        return self._net(e.widths, e.depth)

    def table(self) -> str:
        full = self.entries[-1].size
        return "\n".join(f"{e.name:>3}  r_w={e.ratio:.2f}  exits={e.depth}  {e.size / 1e6:7.2f}M  ratio {e.size / full:.2f}"
                         for e in reversed(self.entries))
