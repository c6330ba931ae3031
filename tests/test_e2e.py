"""End-to-end: real `flwr run` in the Simulation Engine (SuperLink + Ray) on real Fashion-MNIST."""

import json

import numpy as np
import pytest

from hetfl import launch
from hetfl.common.comm import record_nbytes
from hetfl.common.config import ConfigError
from hetfl.methods import validate
from hetfl.common.rounds import CHECKPOINT, load_checkpoint
from hetfl.common.task import make_model, model_to_arrays

from .conftest import require_fmnist

FAST = {
    "dataset": "fashion_mnist", "data-source": "local", "partitioner": "dirichlet", "dirichlet-alpha": 1.0,
    "fraction-train": 1.0, "min-available-nodes": 10, "local-steps": 20, "batch-size": 32, "lr": 0.05,
    "momentum": 0.9, "max-test-samples": 2000,
}


LEARNED = 0.6  # accuracy after 4 rounds of 5 clients x 20 steps at seed 5 (measured: 0.738; chance 0.1)


def _metrics(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.slow
def test_fedavg_fmnist_learns_counts_bytes_and_a_resumed_run_repeats_it(tmp_path, task_identity):
    """FedAvg in the real Simulation Engine (SuperLink, Ray workers in parallel, random node ids): the run learns,
    counts its bytes and leaves nothing behind. A run stopped after round 2 (on the in-process engine: the same code
    and seeds, one process) and resumed from its checkpoint in the Simulation Engine is, bit for bit, the same seed's
    uninterrupted run (in-process again): same seed, same run, across a restart and across engines (each method's
    same-seed runs: tests/test_determinism.py; AdaptiveFL's resume: tests/test_adaptivefl.py; a checkpoint the
    Simulation Engine wrote, resumed: the resumed run's own, compared below)."""
    from .inprocess import run_in_process
    from .test_determinism import _rows

    require_fmnist()
    over = {**FAST, "method": "fedavg", "seed": 5, "fraction-train": 0.5, "num-server-rounds": 4}
    run = lambda name, **kw: launch.run(None, {**over, "run-name": name, **kw}, num_supernodes=10,  # noqa: E731
                                         results_dir=tmp_path, timeout=900)
    assert run_in_process({**over, "stop-after-round": 2}, 10, tmp_path, "part")["summary"]["rounds_completed"] == 2
    part = run("part", resume=True)
    session = launch.LAST_SESSION
    full = tmp_path / "full"
    run_in_process(over, 10, tmp_path, "full")
    m = _metrics(part)
    assert _rows(m) == _rows(_metrics(full))  # accuracy, loss, bytes and sampled clients of every round
    assert m["resume_download_bytes"] > 0  # node discovery of the resumed run: in no round's row
    a, b = (load_checkpoint(d / CHECKPOINT) for d in (full, part))
    assert a["round"] == b["round"] == 4
    assert all(np.array_equal(a["arrays"][k], b["arrays"][k]) for k in a["arrays"])
    rows = m["rounds"]
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["accuracy"] < 0.2
    assert rows[-1]["accuracy"] > LEARNED, rows  # chance is 0.1
    model_bytes = record_nbytes(model_to_arrays(make_model(validate(FAST))))
    for r in rows[1:]:
        assert r["replies"] == 5 and r["failures"] == 0 and len(r["clients"]) == 5
        assert 5 * model_bytes <= r["bytes_down"] <= 5 * model_bytes + 5 * 2048
        assert 5 * model_bytes <= r["bytes_up"] <= 5 * model_bytes + 5 * 2048
        assert r["client_steps"] == pytest.approx(20) and r["client_proximal_mu"] == 0.0
    assert len({tuple(r["clients"]) for r in rows[1:]}) > 1  # fraction 0.5: the rounds sample different clients
    assert m["summary"]["total_bytes_down"] == sum(r["bytes_down"] for r in rows)
    assert (part / "accuracy.png").exists()
    # the run's SuperLink, its executors and Ray are all gone
    assert session is not None and launch.process_tree({session}) == []


def test_fedprox_mu_reaches_the_client_and_its_training(task_identity):
    """FedProx = the FedAvg run with Flower's FedProx strategy: mu travels in the train config and the client
    trains with it (the simulation path itself is the FedAvg test above)."""
    require_fmnist()
    from flwr.app import ConfigRecord, Context, RecordDict

    from hetfl.baselines import client_app
    from hetfl.baselines.params import FedProxParams
    from hetfl.baselines.server_app import make_strategy
    from hetfl.common.params import FederationParams

    run_config = {**FAST, "method": "fedprox", "fedprox-mu": 0.5, "fraction-train": 0.5, "local-steps": 2, "batch-size": 8}
    cfg = validate(run_config)
    arrays = model_to_arrays(make_model(cfg))

    class Grid:
        def get_node_ids(self):
            return list(range(1, 11))

    from hetfl.common.nodes import ClientMap

    cmap = ClientMap({n: {"client-ids": [n - 1]} for n in range(1, 11)})
    msgs = list(make_strategy(FedProxParams.from_config(cfg), FederationParams.from_config(cfg), cmap).configure_train(1, arrays, ConfigRecord({}), Grid()))
    assert len(msgs) == 5  # fraction-train 0.5 of 10 nodes
    assert all(m.content["config"]["proximal-mu"] == pytest.approx(0.5) for m in msgs)
    pid = int(msgs[0].content["client"]["client-id"])
    ctx = Context(1, msgs[0].metadata.dst_node_id, {"partition-id": pid, "num-partitions": 10}, RecordDict(), run_config)
    reply = client_app.train(msgs[0], ctx, validate(run_config))
    assert reply.content["metrics"]["proximal_mu"] == pytest.approx(0.5) and reply.content["metrics"]["steps"] == 2


def test_invalid_config_fails_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="'dirichlet-alpha'"):
        launch.run(None, {"dirichlet-alpha": -1.0}, results_dir=tmp_path)
    assert not any(tmp_path.iterdir())
