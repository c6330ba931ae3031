"""Co-Boosting's server (Dai et al., ICLR 2024), as the authors' datafree_kd.py runs it (docs/readings.md#coboost).

Every epoch: (1) reset the generator and optimise it and its inputs z for `g_steps` Adam steps so that the weighted
ensemble finds the samples hard for their random target labels (hard-sample loss) and the student disagrees with
the ensemble on them (adversarial term); keep the batch of the lowest loss; (2) from the second epoch, adjust the
ensemble's member weights by signed-gradient steps on the cross-entropy of the weighted ensemble over the synthetic
pool; (3) add the batch to the pool; (4) distil the weighted ensemble into the student over the whole pool, each
batch perturbed by ODS first. Constants of the authors' code: nz = 256, ngf = 64, generator Adam betas (0.5, 0.999),
gradient-norm clip 10 (generator and student), student SGD momentum 0.9, weight decay 1e-4, cosine lr over the epochs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hetfl.common.train import Normalizer, no_denormals

from .core import (Generator, adversarial_loss, hard_sample_loss, kd_kl, ods_perturb, reweight_step,
                   weighted_logits)
from .keys import CoBoostParams

NZ, NGF, CLIP, MOMENTUM, WEIGHT_DECAY = 256, 64, 10.0, 0.9, 1e-4


@no_denormals()
def co_boost(members: Sequence[nn.Module], student: nn.Module, p: CoBoostParams, input_shape: tuple[int, int, int],
             num_classes: int, normalize: Normalizer, seed: int, device: str | torch.device = "cpu",
             epoch_end: Callable[[int, torch.Tensor], None] | None = None) -> torch.Tensor:
    """Run Co-Boosting for `p.epochs` epochs; trains `student` in place and returns the final member weights (M,).

    `epoch_end(epoch, weights)` is called after every epoch's distillation (0-based epoch). Seeded by `seed` only.
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    for m in members:
        m.to(device).eval().requires_grad_(False)
    student.to(device)
    channels, size = input_shape[0], input_shape[-1]
    generator = Generator(NZ, channels, size, NGF).to(device)
    M = len(members)
    weights = torch.full((M,), 1.0 / M, device=device)

    def logits(x: torch.Tensor) -> torch.Tensor:  # (M, B, C)
        return torch.stack([m(x).float() for m in members])

    def to_input(img: torch.Tensor) -> torch.Tensor:  # generator output in [0, 1] -> the models' normalised input
        return normalize(img * 255.0)

    opt = torch.optim.SGD(student.parameters(), lr=p.kd_lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=p.epochs)
    pool_x: list[torch.Tensor] = []
    pool_y: list[torch.Tensor] = []
    pool_z: list[torch.Tensor] = []  # the members' logits on the pool (fixed: the members are frozen)
    for epoch in range(p.epochs):
        best_x, y = _synthesize(generator, student, logits, to_input, weights, p, num_classes, gen, device)
        if epoch > 0:  # (2) ensemble re-weighting over the pool so far (not at the first epoch)
            weights = _reweight(weights, pool_y, pool_z, p, epoch, gen, device)
        with torch.no_grad():  # (3) the new batch joins the pool
            pool_x.append(best_x)
            pool_y.append(y)
            pool_z.append(logits(best_x))
        _distill(student, opt, torch.cat(pool_x), logits, weights, p, gen, device)  # (4)
        sched.step()
        if epoch_end is not None:
            epoch_end(epoch, weights.detach().cpu())
    return weights.detach().cpu()

def _synthesize(generator: Generator, student: nn.Module, logits: Callable[[torch.Tensor], torch.Tensor],
                to_input: Callable[[torch.Tensor], torch.Tensor], weights: torch.Tensor, p: CoBoostParams,
                num_classes: int, gen: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Step (1): the generator (re-initialised) and its codes trained toward hard samples the student
    disagrees on; returns the lowest-loss batch and its labels."""
    B = p.batch_size
    student.eval()
    generator.reset(gen)
    generator.train()
    z = torch.randn(B, NZ, generator=gen).to(device).requires_grad_(True)
    y = torch.randint(0, num_classes, (B,), generator=gen).to(device)
    g_opt = torch.optim.Adam([{"params": generator.parameters()}, {"params": [z]}], lr=p.lr_g, betas=(0.5, 0.999))
    best, best_x = float("inf"), None
    for _ in range(p.g_steps):
        g_opt.zero_grad(set_to_none=True)
        x = to_input(generator(z))
        t = weighted_logits(logits(x), weights)
        loss = p.oh * hard_sample_loss(t, y, p.hs) + p.adv * adversarial_loss(student(x).float(), t)
        loss.backward()
        nn.utils.clip_grad_norm_(generator.parameters(), CLIP)
        g_opt.step()
        if loss.item() < best:
            best, best_x = loss.item(), x.detach()
    return best_x, y


def _reweight(weights: torch.Tensor, pool_y: list[torch.Tensor], pool_z: list[torch.Tensor], p: CoBoostParams,
              epoch: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Step (2): the members' weights moved against the weighted ensemble's loss on the pool so far."""
    py, pz = torch.cat(pool_y), torch.cat(pool_z, dim=1)
    start = weights.clone()
    for idx in torch.randperm(len(py), generator=gen).split(p.batch_size):
        w = weights.detach().requires_grad_(True)
        ce = F.cross_entropy(weighted_logits(pz[:, idx.to(device)], w), py[idx.to(device)])
        (grad,) = torch.autograd.grad(ce, w)
        weights = reweight_step(weights, start, grad, p.mu, p.wdc, epoch)
    return weights


def _distill(student: nn.Module, opt: torch.optim.Optimizer, px: torch.Tensor,
             logits: Callable[[torch.Tensor], torch.Tensor], weights: torch.Tensor, p: CoBoostParams,
             gen: torch.Generator, device: torch.device) -> None:
    """Step (4): one epoch of distillation from the weighted ensemble over the whole pool, ODS-perturbed."""
    student.train()
    for idx in torch.randperm(len(px), generator=gen).split(p.batch_size):
        xb = ods_perturb(px[idx.to(device)], lambda v: weighted_logits(logits(v), weights), p.ods_eta / 255.0, gen)
        s = student(xb).float()
        with torch.no_grad():
            t = weighted_logits(logits(xb), weights)
        loss = kd_kl(s, t, p.kd_t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(student.parameters(), CLIP)
        opt.step()

