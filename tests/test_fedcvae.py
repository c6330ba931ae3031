"""FedCVAE-Ens (Heinbaugh et al. 2023; hetfl/oneshot_app/cvae.py; docs/readings.md#fedcvae).

Hand-worked loss and sampling cases, the client's decoder-only upload, and one end-to-end run on scikit-learn's
digits (4 clients) through the real ServerApp/ClientApp code on the in-process grid.
"""

import gzip
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ConfigRecord, Context, Message, RecordDict
from torch import nn

from hetfl.common.comm import record_nbytes
from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.common.task import model_to_arrays
from hetfl.common.rundata import client_data
from hetfl.oneshot_app import CVAE_LOCAL
from hetfl.oneshot_app.client_app import cvae_local
from hetfl.oneshot_app.cvae import (CVAE, batch_loss, center_crop, cvae_loss, cvae_side, kl_divergence, make_cvae,
                                    pad_to, reconstruction_loss, sample_labels, samples_per_client, synthesize,
                                    truncated_normal)

from .conftest import FMNIST_DIR, require_fmnist
from .inprocess import run_in_process


# ---- loss ----------------------------------------------------------------------------------------------------------
def test_cvae_loss_by_hand():
    # two images of two pixels; BCE on logits summed over pixels, averaged over the batch
    x = torch.tensor([[1.0, 0.0], [1.0, 1.0]]).view(2, 1, 1, 2)
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]]).view(2, 1, 1, 2)
    # image 0: -log(1/2) - log(1/2) = log 4; image 1: -log(3/4) - log(1/2) = log(8/3); mean = log(32/3) / 2
    assert reconstruction_loss(x, logits).item() == pytest.approx(math.log(32 / 3) / 2, rel=1e-6)
    # KL of N(mu, diag(exp(logvar))) from N(0, I): image 0 mu = (1, 0), var = (1, 2): 1/2 (1 + 2 - 0 - 1 - log 2)
    # = 1 - log(2) / 2; image 1: the prior itself, 0
    mu = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    logvar = torch.tensor([[0.0, math.log(2.0)], [0.0, 0.0]])
    assert kl_divergence(mu, logvar).item() == pytest.approx((1 - math.log(2) / 2) / 2, rel=1e-6)
    # total with beta = 2: log(32/3) / 2 + 1 - log(2) / 2 = 1 + log(16/3) / 2
    assert cvae_loss(x, logits, mu, logvar, beta=2.0).item() == pytest.approx(1 + math.log(16 / 3) / 2, rel=1e-6)
    assert cvae_loss(x, logits, mu, logvar, beta=0.0).item() == pytest.approx(math.log(32 / 3) / 2, rel=1e-6)
    # three channels: squared error of sigmoid(logits), summed over pixels: 3 x (1 - 1/2)^2
    assert reconstruction_loss(torch.ones(1, 3, 1, 1), torch.zeros(1, 3, 1, 1)).item() == pytest.approx(0.75)


def test_cvae_shapes_follow_the_authors_32_pixel_model():
    assert (cvae_side(28), cvae_side(32), cvae_side(8)) == (32, 32, 16)
    m = CVAE((1, 28, 28), num_classes=10, z_dim=10)
    assert m.size == (32, 32) and m.decoder.fc.in_features == 20 and m.decoder.fc.out_features == 64 * 2 * 2
    assert m.encoder.model[-1].out_features == 20  # mu and log-variance
    out, mu, logvar = m(torch.rand(3, 1, 32, 32), torch.eye(10)[:3], torch.zeros(3, 10))
    assert out.shape == (3, 1, 32, 32) and mu.shape == logvar.shape == (3, 10)
    # the authors' ConditionalDecoder at z_dim 10: 5,376 + 65,600 + 32,800 + 16,416 + 513 weights, 256 BN weights
    assert sum(p.numel() for p in m.decoder.parameters()) == 5376 + 65600 + 32800 + 16416 + 513 + 256


# ---- image size: zero-pad to the CVAE's side, center-crop back ---------------------------------------------------
def test_pad_then_crop_is_the_identity_on_real_images():
    """FMNIST's 28 x 28 test images go to the CVAE's 32 x 32 with 2 black pixels a side and come back unchanged (a
    bilinear 28 -> 32 -> 28 round trip blurs them); 32-pixel images are left as they are; odd margins work."""
    require_fmnist()
    with gzip.open(FMNIST_DIR / "t10k-images-idx3-ubyte.gz") as f:
        raw = np.frombuffer(f.read(), np.uint8, offset=16)[: 256 * 784]
    x = torch.from_numpy(raw.reshape(256, 1, 28, 28).astype(np.float32) / 255)
    padded = pad_to(x, (32, 32))
    assert padded.shape == (256, 1, 32, 32) and torch.equal(padded[..., 2:30, 2:30], x)
    border = padded.clone()
    border[..., 2:30, 2:30] = 0
    assert not border.any()  # the border is black
    assert torch.equal(center_crop(padded, (28, 28)), x)
    up = F.interpolate(x, size=(32, 32), mode="bilinear", align_corners=False, antialias=True)
    blurred = F.interpolate(up, size=(28, 28), mode="bilinear", align_corners=False, antialias=True)
    assert (blurred - x).abs().mean() > 0.01  # what the resize did
    y = torch.rand(2, 3, 32, 32)
    assert torch.equal(pad_to(y, (32, 32)), y) and torch.equal(center_crop(y, (32, 32)), y)
    odd = torch.rand(2, 1, 27, 30)
    assert pad_to(odd, (32, 32))[..., 2:29, 1:31].equal(odd) and center_crop(pad_to(odd, (32, 32)), (27, 30)).equal(odd)


def test_the_cvae_trains_on_padded_images_and_the_server_keeps_the_crop():
    """A client's batch reaches the CVAE zero-padded (digits: 8 -> 16); the synthetic images are the center crop of
    the decoder's sigmoid output, pixel for pixel."""
    torch.manual_seed(0)
    model = make_cvae((1, 8, 8), 10, 4, seed=3)
    x, y = torch.rand(5, 1, 8, 8), torch.arange(5)
    got = batch_loss(model, x, y, 1.0, torch.Generator().manual_seed(9))
    eps = torch.randn((5, 4), generator=torch.Generator().manual_seed(9))
    logits, mu, logvar = model(pad_to(x, (16, 16)), F.one_hot(y, 10).float(), eps)
    assert got.item() == pytest.approx(cvae_loss(pad_to(x, (16, 16)), logits, mu, logvar, 1.0).item(), rel=1e-6)

    pattern = torch.linspace(-4, 4, 256).view(1, 1, 16, 16)

    class PatternDecoder(nn.Module):  # every image: the same 16 x 16 logits, distinct per pixel
        def forward(self, z, y_hot):
            return pattern.expand(len(z), -1, -1, -1) + 0 * z.sum()

    xs, _ = synthesize([PatternDecoder()], np.array([[3, 1]]), 4, 2, 3.0, (8, 8), torch.Generator().manual_seed(1))
    assert xs.shape == (4, 1, 8, 8)
    assert torch.equal(xs, torch.sigmoid(pattern)[..., 4:12, 4:12].expand(4, -1, -1, -1))


def test_make_cvae_is_seeded_and_leaves_the_global_rng_alone():
    a, b = make_cvae((1, 8, 8), 10, 4, seed=5), make_cvae((1, 8, 8), 10, 4, seed=5)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    make_cvae((1, 8, 8), 10, 4, seed=5)
    assert torch.equal(torch.rand(4), expected)


# ---- sampling ------------------------------------------------------------------------------------------------------
def test_samples_split_by_data_size_and_labels_follow_each_clients_counts():
    assert samples_per_client([1, 1, 1], 10) == [3, 3, 4]  # floor of each share, the last client the rest
    assert samples_per_client([5, 4], 1000) == [555, 445]
    gen = torch.Generator().manual_seed(0)
    assert set(sample_labels([0, 5, 0], 300, gen).tolist()) == {1}
    y = sample_labels([2, 0, 6], 8000, gen)
    assert set(y.tolist()) == {0, 2} and (y == 0).float().mean().item() == pytest.approx(0.25, abs=0.02)

    class LabelDecoder(nn.Module):  # every pixel's logit is the label: images are sigmoid(label)
        def forward(self, z, y_hot):
            return y_hot.argmax(1).float().view(-1, 1, 1, 1).expand(-1, 1, 16, 16) + 0 * z.sum()

    x, y = synthesize([LabelDecoder(), LabelDecoder()], np.array([[0, 5, 0], [2, 0, 2]]), 1000, 4, 3.0, (8, 8),
                      torch.Generator().manual_seed(1), batch_size=64)
    assert x.shape == (1000, 1, 8, 8) and y.shape == (1000,)
    assert set(y[:555].tolist()) == {1} and set(y[555:].tolist()) == {0, 2}  # client 0's share, then client 1's
    assert torch.allclose(x[:, 0, 0, 0], torch.sigmoid(y.float()), atol=1e-6)  # each image from its own label
    z = truncated_normal(20000, 3, 1.0, torch.Generator().manual_seed(2))
    # N(0, 1) truncated at +-1: variance 1 - 2 phi(1) / (2 Phi(1) - 1) = 0.2911
    assert z.abs().max().item() <= 1.0 and z.std().item() == pytest.approx(math.sqrt(0.2911), abs=0.01)
    assert abs(z.mean().item()) < 0.01
    assert truncated_normal(5000, 2, 0.0, torch.Generator().manual_seed(3)).abs().max().item() > 3.0  # untruncated


# ---- client: the decoder goes up, the encoder stays ------------------------------------------------------------------
def _decoder_bytes(input_shape=(1, 8, 8)) -> int:
    """Serialized size of a trained decoder's state: Flower's object tree stores equal arrays once, so every float
    tensor gets distinct values (a fresh model's zero biases and unit BN weights would be shared) and the BN step
    counters one common value (as training leaves them)."""
    dec = make_cvae(input_shape, 10, 10, seed=0).decoder
    with torch.no_grad():
        for name, t in dec.state_dict().items():
            t.copy_(torch.full_like(t, 7) if name.endswith("num_batches_tracked") else torch.randn(t.shape))
    return record_nbytes(model_to_arrays(dec))


# 14 CVAE epochs: digits' 8 x 8 images fill a quarter of the CVAE's zero-padded 16 x 16 canvas (seeds 1-3 end at
# 74-79% test accuracy; 8 epochs, enough when the images were stretched to 16, end at 30-38%)
CFG = {"method": "fedcvae", "dataset": "digits", "data-source": "local", "partitioner": "dirichlet",
       "dirichlet-alpha": 1.0, "min-available-nodes": 4, "local-steps": 0, "local-epochs": 14, "batch-size": 32,
       "optimizer": "adam", "lr": 3e-3, "max-test-samples": 0, "checkpoint": False, "seed": 1,
       "fedcvae-samples": 1000, "fedcvae-epochs": 3}


def test_client_uploads_only_the_decoder_and_its_label_counts(task_identity):
    cfg = validate({**CFG, "local-epochs": 1})
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 2, "num-partitions": 4}, state=RecordDict(),
                  run_config=cfg)
    msg = Message(RecordDict({"config": ConfigRecord({"server-round": 0})}), dst_node_id=1, message_type=CVAE_LOCAL)
    reply = cvae_local(msg, ctx, cfg)
    cvae = make_cvae((1, 8, 8), 10, 10, seed=0)
    assert set(reply.content.keys()) == {"arrays", "metrics"}
    assert set(reply.content["arrays"].keys()) == set(cvae.decoder.state_dict())  # no encoder tensor
    decoder_bytes = _decoder_bytes()
    assert record_nbytes(reply.content["arrays"]) == decoder_bytes < record_nbytes(model_to_arrays(cvae)) * 0.6
    data = client_data(ctx, cfg, 2)
    metrics = reply.content["metrics"]
    assert list(metrics["label_counts"]) == np.bincount(data.y, minlength=10).tolist()
    assert metrics["num-examples"] == len(data) and np.isfinite(metrics["train_loss"])
    # what a reply is: the decoder and a small metrics record (sizes, counts, loss, time)
    assert record_nbytes(reply.content) - decoder_bytes < 1024


def test_fedcvae_config_checks():
    validate({"method": "fedcvae"})
    with pytest.raises(ConfigError, match="'dataset' = 'ag_news' does not fit method 'fedcvae'"):
        validate({"method": "fedcvae", "dataset": "ag_news", "model": "text"})
    with pytest.raises(ConfigError, match="'resume'"):
        validate({"method": "fedcvae", "resume": True})
    with pytest.raises(ConfigError, match="fedcvae-samples"):
        validate({"method": "coboost", "fedcvae-samples": 10}, given=["method", "fedcvae-samples"])


# ---- end to end ----------------------------------------------------------------------------------------------------
def test_fedcvae_end_to_end(tmp_path, task_identity):
    """CVAEs on 4 clients, a 1,000-image synthetic set, 3 classifier epochs: well above chance (10%) on the test
    split; the upload is 4 decoders plus counts, nothing but a request goes down, nothing moves after round 0."""
    m = run_in_process(CFG, 4, tmp_path, "fedcvae")
    rows = m["rounds"]
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert rows[-1]["accuracy"] > 0.5, [r["accuracy"] for r in rows]
    ph = m["phases"]
    assert ph["num_models"] == 4 and ph["member_client_ids"] == [0, 1, 2, 3] and ph["synthetic_samples"] == 1000
    assert sum(ph["synthetic_label_counts"]) == 1000 and min(ph["synthetic_label_counts"]) > 0
    decoder_bytes = _decoder_bytes()
    assert 4 * decoder_bytes <= ph["upload_bytes"] <= 4 * (decoder_bytes + 2048)
    assert ph["phase1_request_bytes"] <= 4 * 2048  # no model down: the clients start from their own CVAEs
    assert rows[0]["bytes_up"] >= ph["upload_bytes"] and rows[0]["clients"] == [0, 1, 2, 3]
    assert all(r["bytes_up"] == 0 and r["bytes_down"] == 0 for r in rows[1:])
    assert m["report"]["accuracy"].startswith("fedcvae classifier")
