"""The one-shot baselines' math as pure functions (docs/readings.md#oneshot).

FedKD's weighted teacher and L1 loss, Fed-ET's weighted consensus and diversity term, Co-Boosting's generator,
hard-sample loss, adversarial term, ensemble re-weighting step and ODS perturbation.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetfl.common.oneshot.ensemble import label_count_weights


# ---- FedKD (Gong et al. 2022; authors' myfed.py) ---------------------------------------------------------------
def fedkd_weights(label_counts: np.ndarray, weighting: str) -> torch.Tensor:
    """Member weights (M, C): "class-counts" = n_mc / sum_m n_mc (authors' clscnt = 1; a class nobody holds:
    uniform), "data-size" = n_m / n for every class."""
    counts = np.asarray(label_counts, np.float64)
    if weighting == "class-counts":
        w = label_count_weights(counts)
    elif weighting == "data-size":
        w = np.repeat((counts.sum(1) / counts.sum())[:, None], counts.shape[1], axis=1)
    else:
        raise ValueError(f"unknown FedKD weighting {weighting!r}")
    return torch.as_tensor(w, dtype=torch.float32)


def fedkd_teacher(z: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The teacher's logits (N, C) = sum_m w_mc z_nmc from the members' logits z (N, M, C)."""
    return (z * weights[None]).sum(1)


def kd_kl(student: torch.Tensor, teacher: torch.Tensor, T: float) -> torch.Tensor:
    """T^2 KL(softmax(teacher / T) || softmax(student / T)), summed over classes, averaged over the batch."""
    return F.kl_div(F.log_softmax(student / T, 1), F.softmax(teacher / T, 1), reduction="batchmean") * T * T


def fedkd_loss(student: torch.Tensor, teacher: torch.Tensor, loss: str) -> torch.Tensor:
    """FedKD's distillation loss: "l1" = mean |student - teacher| over batch and classes (the authors' default
    ``L1Loss``), "kl" = :func:`kd_kl` at T = 3 (their ``kl_loss``)."""
    return (student - teacher).abs().mean() if loss == "l1" else kd_kl(student, teacher, 3.0)


# ---- Fed-ET (Cho et al. 2022, Sec. 3.2) ---------------------------------------------------------------------------
def fedet_targets(z: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weighted consensus and diversity targets from the members' logits z (N, M, C).

    Each member's confidence on a sample is the variance of its softmax over the classes; the majority vote of the
    members' predicted labels (ties: the smallest label) picks the consensus members, whose softmax outputs are
    averaged weighted by confidence (the consensus target); the other members' outputs, weighted the same way, are
    the diversity target. Returns (consensus (N, C), diversity (N, C), has_diversity (N,) bool: some member
    disagrees). A group whose confidences are all 0 (uniform outputs) is averaged with equal weights.
    """
    p = F.softmax(z.float(), dim=-1)
    conf = p.var(dim=-1, unbiased=False)  # (N, M)
    votes = p.argmax(-1)  # (N, M)
    majority = F.one_hot(votes, p.shape[-1]).sum(1).argmax(-1)  # (N,): argmax returns the first maximum
    agree = votes == majority[:, None]

    def weighted(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = conf * mask
        w = torch.where((w.sum(1, keepdim=True) > eps), w, mask.float())  # all-uniform group: equal weights
        total = w.sum(1, keepdim=True)
        return (w[..., None] * p).sum(1) / total.clamp_min(eps), total[:, 0] > 0

    consensus, _ = weighted(agree)
    diversity, has = weighted(~agree)
    return consensus, diversity, has


def fedet_loss(student: torch.Tensor, consensus: torch.Tensor, diversity: torch.Tensor, has: torch.Tensor,
               lam: float) -> torch.Tensor:
    """Fed-ET's server loss on a batch: KL(consensus || student) + lam KL(diversity || student), the second term only
    on samples where some member disagrees with the majority; both averaged over the batch."""
    logq = F.log_softmax(student.float(), dim=1)

    def kl(p: torch.Tensor) -> torch.Tensor:  # per sample
        return (p * (torch.log(p.clamp_min(1e-12)) - logq)).sum(1)

    return kl(consensus).mean() + lam * (kl(diversity) * has.float()).mean()


# ---- Co-Boosting (Dai et al. 2024; authors' datafree/synthesis/coboost.py, datafree_kd.py) --------------------------
class Generator(nn.Module):
    """The authors' DENSE/Co-Boosting generator: z -> linear -> (2 ngf, s/4, s/4) -> 2 x (upsample, conv, BN,
    LeakyReLU) -> conv -> sigmoid image in [0, 1] of shape (channels, size, size)."""

    def __init__(self, nz: int, channels: int, size: int, ngf: int = 64) -> None:
        super().__init__()
        self.init_size = size // 4
        self.l1 = nn.Linear(nz, ngf * 2 * self.init_size ** 2)
        self.conv = nn.Sequential(
            nn.BatchNorm2d(ngf * 2), nn.Upsample(scale_factor=2),
            nn.Conv2d(ngf * 2, ngf * 2, 3, padding=1, bias=False), nn.BatchNorm2d(ngf * 2), nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(ngf * 2, ngf, 3, padding=1, bias=False), nn.BatchNorm2d(ngf), nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, channels, 3, padding=1), nn.Sigmoid(),
        )
        self.size = size

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.l1(z).view(z.shape[0], -1, self.init_size, self.init_size)
        img = self.conv(out)
        return img if img.shape[-1] == self.size else F.interpolate(img, size=(self.size, self.size))

    def reset(self, gen: torch.Generator) -> None:
        """The authors' ``reset_model`` before every synthesis: conv/linear weights N(0, 0.02), biases 0, BN weights
        N(1, 0.02), BN biases 0."""
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                with torch.no_grad():
                    m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                with torch.no_grad():
                    m.weight.copy_(1.0 + torch.randn(m.weight.shape, generator=gen) * 0.02)
                nn.init.zeros_(m.bias)


def weighted_logits(logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The authors' ``WEnsemble``: sum_m w_m z_m / sum_m w_m from member logits (M, B, C) and weights (M,)."""
    return (weights[:, None, None] * logits).sum(0) / weights.sum()


def hard_sample_loss(teacher: torch.Tensor, targets: torch.Tensor, hs: float) -> torch.Tensor:
    """Co-Boosting's hard-sample term: mean_n (1 - p_n)^hs CE(teacher_n, y_n), p_n the teacher's (detached)
    probability of the target y_n: samples the ensemble already finds easy count less."""
    p = F.softmax(teacher, 1).gather(1, targets[:, None])[:, 0].detach()
    return ((1 - p).pow(hs) * F.cross_entropy(teacher, targets, reduction="none")).mean()


def adversarial_loss(student: torch.Tensor, teacher: torch.Tensor, T: float = 3.0) -> torch.Tensor:
    """Minus the student-teacher disagreement: -mean_n T^2 KL(softmax(teacher_n / T) || softmax(student_n / T))
    (the generator maximizes it: samples the student has not learnt yet)."""
    return -kd_kl(student, teacher, T)


def reweight_step(weights: torch.Tensor, start: torch.Tensor, grad: torch.Tensor, mu: float, wdc: float,
                  epoch: int) -> torch.Tensor:
    """One step of Co-Boosting's ensemble re-weighting: w - mu wdc^epoch sign(grad), kept within [start - 1,
    start + 1] (the authors' eta clamp) and within [0, 1]."""
    w = weights - mu * wdc ** epoch * grad.sign()
    return torch.clamp(start + torch.clamp(w - start, -1.0, 1.0), 0.0, 1.0)


def ods_perturb(x: torch.Tensor, logits_fn, eta: float, gen: torch.Generator) -> torch.Tensor:
    """Output-diversified sampling (the authors' KD step): x + eta sign(grad_x sum(w * softmax(f(x) / 4))) with w
    uniform in [-1, 1] per logit, drawn from `gen`."""
    x = x.detach().requires_grad_(True)
    out = logits_fn(x)
    w = (torch.rand(out.shape, generator=gen) * 2 - 1).to(out.device)
    (grad,) = torch.autograd.grad((w * F.softmax(out / 4, dim=1)).sum(), x)
    return (x + eta * grad.sign()).detach()
