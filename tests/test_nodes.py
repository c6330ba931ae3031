"""Node discovery, seeded client sampling and the strategy contract (docs/architecture.md)."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from hetfl.baselines.strategy import SeededFedAvg, SeededFedProx
from hetfl.common.nodes import NodeDirectory, sample_clients
from hetfl.common.registry import NODE_QUERY


def test_sample_clients_is_a_seeded_uniform_sample_of_client_ids():
    clients = list(range(100))
    a = sample_clients(clients, 10, seed=0, server_round=1)
    assert len(a) == 10 == len(set(a)) and set(a) <= set(clients) and a == sorted(a)
    assert sample_clients(reversed(clients), 10, 0, 1) == a  # the input order does not matter
    assert sample_clients(clients, 10, 0, 2) != a and sample_clients(clients, 10, 1, 1) != a
    assert sample_clients(clients, 200, 0, 1) == clients and sample_clients([], 3, 0, 1) == []
    # uniform: over many rounds every client is drawn about k/n of the time
    counts = np.bincount(np.concatenate([sample_clients(clients, 10, 0, r) for r in range(1, 2001)]), minlength=100)
    assert counts.min() > 140 and counts.max() < 265  # mean 200, binomial sd ~13


class Grid:
    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def get_node_ids(self):
        return list(self.answers)

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            assert m.metadata.message_type == NODE_QUERY
            self.asked.append(m.metadata.dst_node_id)
            out.append(Message(RecordDict({"config": ConfigRecord(self.answers[m.metadata.dst_node_id])}), reply_to=m))
        return out


def test_directory_maps_clients_refreshes_new_nodes_and_orders_by_client(task_identity):
    d = NodeDirectory({900: {"client-id": 2, "device-class": "hpc"}, 17: {"client-id": 0}, 55: {"client-id": 1}})
    assert d.clients() == {900: 2, 17: 0, 55: 1} and d.field("device-class") == {2: "hpc"}
    assert d.order([900, 55, 17]) == [17, 55, 900]
    grid = Grid({900: {"client-id": 2}, 17: {"client-id": 0}, 55: {"client-id": 1}, 4: {"client-id": 1}})
    d.refresh(grid, timeout=1)
    assert grid.asked == [4]  # only the node that connected later is asked
    assert d.online(grid) == {0: 17, 1: 4, 2: 900}  # two nodes claim client 1: the lower node id serves it


def _reply(msg, arrays, n=5):
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                               "metrics": MetricRecord({"num-examples": n})}), reply_to=msg)


def test_seeded_fedavg_samples_by_client_id_and_rejects_malformed_replies(task_identity):
    nodes = {1000 + 7 * c: {"client-id": c} for c in range(10)}
    d = NodeDirectory(nodes)
    s = SeededFedAvg(fraction_train=0.3, fraction_evaluate=0.0, min_available_nodes=1).bind(d, seed=4)
    w = {"w": np.zeros((2, 2), np.float32)}
    msgs = list(s.configure_train(1, ArrayRecord({k: Array(v) for k, v in w.items()}), ConfigRecord(), Grid(nodes)))
    assert s.sampled == sample_clients(range(10), 3, 4, 1)
    assert sorted(m.metadata.dst_node_id for m in msgs) == sorted(1000 + 7 * c for c in s.sampled)
    good = [_reply(msgs[0], {"w": np.ones((2, 2), np.float32)}), _reply(msgs[1], {"w": 3 * np.ones((2, 2), np.float32)})]
    bad = _reply(msgs[2], {"w": np.full((2, 2), np.nan, np.float32)})
    arrays, _ = s.aggregate_train(1, s.order_replies([bad, *good]))
    assert s.rejected == 1
    np.testing.assert_allclose(arrays["w"].numpy(), 2.0)  # the NaN reply never reached the average


def test_seeded_fedprox_keeps_flower_fedprox_config_and_seeded_sampling(task_identity):
    nodes = {300 + c: {"client-id": c} for c in range(6)}
    s = SeededFedProx(proximal_mu=0.3, fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=1)
    msgs = list(s.bind(NodeDirectory(nodes), seed=9).configure_train(
        2, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), ConfigRecord(), Grid(nodes)))
    assert sorted(m.metadata.dst_node_id - 300 for m in msgs) == sample_clients(range(6), 3, 9, 2)
    assert all(m.content["config"]["proximal-mu"] == pytest.approx(0.3) for m in msgs)


@pytest.mark.parametrize("arrival", [[0, 1, 2], [2, 0, 1], [1, 2, 0]])
def test_replies_are_aggregated_in_client_order_whatever_the_arrival(arrival, task_identity):
    nodes = {500 - c: {"client-id": c} for c in range(3)}
    s = SeededFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1).bind(NodeDirectory(nodes), 0)
    msgs = list(s.configure_train(1, ArrayRecord({"w": Array(np.zeros(3, np.float32))}), ConfigRecord(), Grid(nodes)))
    by_node = {m.metadata.dst_node_id: m for m in msgs}
    replies = [_reply(by_node[500 - c], {"w": np.full(3, 0.1 * (c + 1), np.float32)}, n=c + 1) for c in range(3)]
    ordered = s.order_replies([replies[i] for i in arrival])
    assert [r.metadata.src_node_id for r in ordered] == [500, 499, 498]
