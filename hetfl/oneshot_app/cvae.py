"""FedCVAE-Ens (Heinbaugh et al., ICLR 2023), as the authors' code runs it (docs/readings.md#fedcvae).

Every client trains a conditional VAE on its data and uploads only its decoder with its label counts; the server
draws, for each client, a share of the synthetic set proportional to the client's data size, labels from the
client's label distribution and latent vectors from a truncated N(0, I), decodes them with that client's decoder,
and trains the classifier on the union. This module holds the authors' encoder/decoder, the loss, the sampling and
the synthesis; images reach the CVAE zero-padded to a side divisible by 16 and leave it center-cropped back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetfl.common.train import Normalizer
from hetfl.data.catalog import DatasetInfo

DOWNSAMPLE = 16  # the encoder halves the side four times: the CVAE's sides are multiples of 16 (authors: 32 x 32)


def cvae_side(side: int) -> int:
    """The CVAE's image side for inputs of `side` pixels: the next multiple of 16 (28 -> 32, the authors' side)."""
    return DOWNSAMPLE * math.ceil(side / DOWNSAMPLE)


def _margins(inner: Sequence[int], outer: Sequence[int]) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) margins of an `inner` (H, W) image centred in `outer` (H, W); the odd pixel at
    the bottom/right."""
    dh, dw = outer[0] - inner[0], outer[1] - inner[1]
    if dh < 0 or dw < 0:
        raise ValueError(f"image of {tuple(inner)} does not fit in {tuple(outer)}")
    return dh // 2, dh - dh // 2, dw // 2, dw - dw // 2


def pad_to(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """An NCHW batch zero-padded (black border) to `size`, centred: 28 -> 32 adds 2 pixels on each side; the batch
    itself if already that size. :func:`center_crop` undoes it exactly."""
    top, bottom, left, right = _margins(x.shape[-2:], size)
    return F.pad(x, (left, right, top, bottom)) if top or bottom or left or right else x


def center_crop(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """The centred `size` window of an NCHW batch: the inverse of :func:`pad_to` (32 -> 28 drops 2 pixels a side)."""
    top, bottom, left, right = _margins(size, x.shape[-2:])
    return x[..., top : x.shape[-2] - bottom, left : x.shape[-1] - right]


class ConditionalEncoder(nn.Module):
    """The authors' encoder: four (conv 4x4 stride 2, BN, ReLU) blocks 32-32-64-64, then linear 500, linear 2 z_dim
    (mu, then log-variance). No activation between the two linear layers (as theirs)."""

    def __init__(self, channels: int, size: tuple[int, int], z_dim: int) -> None:
        super().__init__()
        h, w = size[0] // DOWNSAMPLE, size[1] // DOWNSAMPLE
        self.model = nn.Sequential(
            nn.Conv2d(channels, 32, 4, 2, 1), nn.BatchNorm2d(32), nn.ReLU(True),
            nn.Conv2d(32, 32, 4, 2, 1), nn.BatchNorm2d(32), nn.ReLU(True),
            nn.Conv2d(32, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(True),
            nn.Conv2d(64, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(True),
            nn.Flatten(1), nn.Linear(64 * h * w, 500), nn.Linear(500, 2 * z_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class ConditionalDecoder(nn.Module):
    """The authors' decoder: linear (z, one-hot label) -> (64, side/16, side/16), ReLU, then three (transposed conv
    4x4 stride 2, BN eps 1e-3, ReLU) blocks 64-32-32 and a last transposed conv to the image's channels: logits."""

    def __init__(self, channels: int, size: tuple[int, int], num_classes: int, z_dim: int) -> None:
        super().__init__()
        self.shape = (64, size[0] // DOWNSAMPLE, size[1] // DOWNSAMPLE)
        self.fc = nn.Linear(z_dim + num_classes, math.prod(self.shape))
        self.model = nn.Sequential(
            nn.ReLU(True),
            nn.ConvTranspose2d(64, 64, 4, 2, 1), nn.BatchNorm2d(64, 1e-3), nn.ReLU(True),
            nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.BatchNorm2d(32, 1e-3), nn.ReLU(True),
            nn.ConvTranspose2d(32, 32, 4, 2, 1), nn.BatchNorm2d(32, 1e-3), nn.ReLU(True),
            nn.ConvTranspose2d(32, channels, 4, 2, 1),
        )

    def forward(self, z: torch.Tensor, y_hot: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.cat((z, y_hot.to(z.dtype)), 1))
        return self.model(h.view(-1, *self.shape))


class CVAE(nn.Module):
    """Encoder + decoder on images of side `cvae_side` (inputs are zero-padded to it); PyTorch's default
    initialisation (the authors define a Kaiming init but never call it)."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, z_dim: int) -> None:
        super().__init__()
        channels = int(input_shape[0])
        self.size = (cvae_side(int(input_shape[1])), cvae_side(int(input_shape[2])))
        self.num_classes, self.z_dim = num_classes, z_dim
        self.encoder = ConditionalEncoder(channels, self.size, z_dim)
        self.decoder = ConditionalDecoder(channels, self.size, num_classes, z_dim)

    def forward(self, x: torch.Tensor, y_hot: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Reconstruction logits, mu, log-variance of a batch at the CVAE's size; z = mu + exp(logvar / 2) eps."""
        stats = self.encoder(x)
        mu, logvar = stats[:, : self.z_dim], stats[:, self.z_dim :]
        return self.decoder(mu + torch.exp(logvar / 2) * eps, y_hot), mu, logvar


def make_cvae(input_shape: Sequence[int], num_classes: int, z_dim: int, seed: int) -> CVAE:
    """A CVAE initialised from `seed` (each client draws its own: the authors' should_initialize_same = 0); the
    global torch RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CVAE(input_shape, num_classes, z_dim)


def unit_normalizer(info: DatasetInfo) -> Normalizer:
    """uint8 pixels -> [0, 1] (the authors train the CVAE on unnormalised ToTensor images)."""
    c = max(1, len(info.mean))
    return Normalizer(dataclasses.replace(info, mean=(0.0,) * c, std=(1.0,) * c))


# ---- loss (the authors'; docs/readings.md#fedcvae) ------------------------------------------------------------------
def reconstruction_loss(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Summed over pixels, averaged over the batch: binary cross-entropy on the logits for one channel, squared error
    of sigmoid(logits) for more (the authors' 3-channel case). `x` in [0, 1]."""
    if x.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits.float(), x.float(), reduction="sum") / x.shape[0]
    return F.mse_loss(torch.sigmoid(logits.float()), x.float(), reduction="sum") / x.shape[0]


def kl_divergence(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, diag exp(logvar)) || N(0, I)) = -1/2 sum_j (1 + logvar_j - mu_j^2 - exp(logvar_j)), batch mean."""
    mu, logvar = mu.float(), logvar.float()
    return (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).sum(1).mean()


def cvae_loss(x: torch.Tensor, logits: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor, beta: float) -> torch.Tensor:
    """The negative ELBO the clients minimise: reconstruction + beta KL (paper Sec. 3; authors' UserFedCVAE.train)."""
    return reconstruction_loss(x, logits) + beta * kl_divergence(mu, logvar)


def batch_loss(model: CVAE, x: torch.Tensor, y: torch.Tensor, beta: float, gen: torch.Generator) -> torch.Tensor:
    """One training batch: images `x` in [0, 1] zero-padded to the CVAE's size, labels one-hot, noise from `gen`."""
    x = pad_to(x, model.size)
    eps = torch.randn((x.shape[0], model.z_dim), generator=gen).to(x.device)
    logits, mu, logvar = model(x, F.one_hot(y, model.num_classes).float(), eps)
    return cvae_loss(x, logits, mu, logvar, beta)


# ---- sampling and synthesis (the authors'; docs/readings.md#fedcvae) ------------------------------------------------
def samples_per_client(num_examples: Sequence[int], total: int) -> list[int]:
    """Client m's share of `total` synthetic samples: floor(total n_m / n), the last client the remainder (authors'
    should_weight = 1)."""
    n = int(sum(num_examples))
    shares = [int(total) * int(k) // n for k in num_examples[:-1]]
    return [*shares, int(total) - sum(shares)]


def sample_labels(counts: Sequence[int], n: int, gen: torch.Generator) -> torch.Tensor:
    """`n` labels drawn i.i.d. from a client's label distribution counts / sum(counts) (authors: np.random.choice
    with the client's pmf)."""
    p = torch.as_tensor(np.asarray(counts, np.float64))
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    return torch.multinomial(p / p.sum(), n, replacement=True, generator=gen)


def truncated_normal(n: int, dim: int, bound: float, gen: torch.Generator) -> torch.Tensor:
    """(n, dim) draws of N(0, 1) truncated to [-bound, bound] by inverse CDF (authors: scipy truncnorm with
    ``uniform_range``); bound = 0: untruncated N(0, I)."""
    if bound <= 0:
        return torch.randn((n, dim), generator=gen)
    lo = 0.5 * math.erfc(bound / math.sqrt(2))  # Phi(-bound)
    u = lo + torch.rand((n, dim), generator=gen, dtype=torch.float64) * (1 - 2 * lo)
    return torch.special.ndtri(u).clamp(-bound, bound).float()


@torch.no_grad()
def synthesize(decoders: Sequence[nn.Module], label_counts: np.ndarray, total: int, z_dim: int, z_bound: float,
               out_size: tuple[int, int], gen: torch.Generator, device: str | torch.device = "cpu",
               batch_size: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """The synthetic training set: images in [0, 1] at `out_size` (the classifier's input) and labels.

    Client m's decoder (eval mode: BN running statistics) draws ``samples_per_client(label sums, total)[m]``
    samples with labels from its label counts and z from the truncated normal; images are sigmoid(logits)
    (authors), then center-cropped from the CVAE's side to the classifier's (undoing the clients' :func:`pad_to`).
    Returns (x float32 (N, C, H, W), y int64 (N,)).
    """
    counts = np.asarray(label_counts, np.int64)
    shares = samples_per_client(counts.sum(1).tolist(), total)
    xs, ys = [], []
    for dec, c, n in zip(decoders, counts, shares, strict=True):
        dec.to(device).eval()
        y = sample_labels(c, n, gen)
        z = truncated_normal(n, z_dim, z_bound, gen)
        for pos in range(0, n, batch_size):
            yb = y[pos : pos + batch_size]
            logits = dec(z[pos : pos + batch_size].to(device), F.one_hot(yb, counts.shape[1]).float().to(device))
            xs.append(center_crop(torch.sigmoid(logits.float()), out_size).cpu())
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)
