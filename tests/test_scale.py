"""Start-up that grows linearly: bounded discovery, logical clients per SuperNode (docs/architecture.md#scale).

Flower's simulation pump walks every stored message for every SuperNode on each pass
(measured with scripts/profile_pump.py at commit 08c8f33, a one-off script since removed), so what start-up may cost
is counted here in messages, not timed: before round 1 the server sends one discovery message per SuperNode, at most
``DISCOVERY_BATCH`` at a time, and nothing per client when SuperNodes host many clients.
"""

import pytest

from hetfl.common.nodes import DISCOVERY_BATCH
from hetfl.common.registry import NODE_QUERY
from hetfl.inprocess import InProcessGrid, run_in_process

from .conftest import require_fmnist

LIGHT = {"method": "fedavg", "dataset": "fashion_mnist", "data-source": "local", "partitioner": "iid",
         "num-server-rounds": 1, "local-steps": 1, "batch-size": 8, "max-test-samples": 100, "checkpoint": False}


def _count_before_round1(monkeypatch, cfg, nodes, tmp_path, name):
    """(messages sent before the first train message, the largest batch of them, clients trained in round 1)."""
    sent: list[list[str]] = []
    original = InProcessGrid.send_and_receive

    def counting(self, messages, *, timeout=None):
        messages = list(messages)
        sent.append([m.metadata.message_type for m in messages])
        return original(self, messages, timeout=timeout)

    monkeypatch.setattr(InProcessGrid, "send_and_receive", counting)
    m = run_in_process(cfg, nodes, tmp_path, name)
    first_train = next(i for i, b in enumerate(sent) if any(t != NODE_QUERY for t in b))
    before = sent[:first_train]
    assert all(t == NODE_QUERY for b in before for t in b)
    return sum(map(len, before)), max(map(len, before)), m["rounds"][1]["clients"]


@pytest.mark.parametrize("clients", [1000, 2000])
def test_one_client_per_supernode_costs_one_discovery_message_per_node_in_bounded_batches(
        clients, monkeypatch, tmp_path, task_identity):
    require_fmnist()
    cfg = {**LIGHT, "min-available-nodes": clients, "fraction-train": 5 / clients}
    n, largest, trained = _count_before_round1(monkeypatch, cfg, clients, tmp_path, f"c{clients}")
    assert n == clients and largest <= DISCOVERY_BATCH  # linear: one message per client, never all at once
    assert len(trained) == 5 and max(trained) < clients


@pytest.mark.parametrize("clients", [1000, 2000])
def test_logical_clients_cost_one_discovery_message_per_supernode(clients, monkeypatch, tmp_path, task_identity):
    require_fmnist()
    cfg = {**LIGHT, "num-clients": clients, "min-available-nodes": 10, "fraction-train": 5 / clients}
    n, largest, trained = _count_before_round1(monkeypatch, cfg, 10, tmp_path, f"l{clients}")
    assert n == 10 and largest == 10  # nothing per client: 10 SuperNodes host all of them
    assert len(trained) == 5 and all(0 <= c < clients for c in trained)
