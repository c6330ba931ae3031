"""The client-to-node map, bounded discovery, seeded client sampling and the strategy contract (docs/architecture.md)."""

import uuid

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from hetfl.baselines.strategy import SeededFedAvg, SeededFedProx
from hetfl.common.nodes import ClientMap, ask_nodes, sample_clients
from hetfl.common.registry import NODE_QUERY
from hetfl.common.hosting import hosted_clients


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


def test_hosted_clients_deal_every_client_to_exactly_one_node():
    assert hosted_clients(3, 10, 0) == [3]  # one client per node: its partition id
    assert hosted_clients(2, 4, 10) == [2, 6]
    nodes = [hosted_clients(p, 7, 100) for p in range(7)]
    assert sorted(c for h in nodes for c in h) == list(range(100))
    assert max(map(len, nodes)) - min(map(len, nodes)) <= 1


class Grid:
    """Nodes that answer discovery with `answers` and train messages with `train(msg) -> reply`; records traffic."""

    def __init__(self, answers, train=None):
        self.answers, self.train, self.asked, self.batches = answers, train, [], []

    def get_node_ids(self):
        return list(self.answers)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.batches.append([m.metadata.dst_node_id for m in messages])
        out = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # as Flower's grids do when pushing
            if m.metadata.message_type == NODE_QUERY:
                self.asked.append(m.metadata.dst_node_id)
                out.append(Message(RecordDict({"config": ConfigRecord(self.answers[m.metadata.dst_node_id])}), reply_to=m))
            else:
                out.append(self.train(m))
        return out[::-1]  # arrival order is not send order


def one(c, **fields):
    return {"client-ids": [c], **{k: [v] for k, v in fields.items()}}


def test_client_map_maps_clients_fields_and_moves_a_restarted_node(task_identity):
    m = ClientMap({900: one(2, **{"device-class": "hpc"}), 17: one(0), 55: {"client-ids": [1, 3]}})
    assert m.node == {2: 900, 0: 17, 1: 55, 3: 55} and m.clients() == [0, 1, 2, 3]
    assert m.field("device-class") == {2: "hpc"}
    # node 55 restarts as node 4 (same clients; its old id is gone), node 17 is gone
    grid = Grid({900: one(2), 4: {"client-ids": [1, 3]}})
    m.refresh(grid, timeout=1)
    assert grid.asked == [4]  # only the node that connected later is asked
    assert m.node[1] == 4 and m.node[3] == 4 and m.hosted[55] == []
    assert m.online(grid) == [1, 2, 3]  # client 0's node is not connected
    with pytest.raises(ValueError, match="field 'tier' has 1 values for 2 client ids"):
        m.add(7, {"client-ids": [5, 6], "tier": ["weak"]})


def test_a_client_claimed_while_its_node_is_live_is_refused_until_that_node_is_gone(task_identity, caplog):
    caplog.set_level("INFO", logger="hetfl")
    # one batch of answers: the first node (in node-id order) serves client 1; the second claim is refused
    m = ClientMap({30: {"client-ids": [0, 1]}, 12: {"client-ids": [1, 2]}})
    assert m.node == {0: 30, 1: 12, 2: 12} and m.hosted == {12: [1, 2], 30: [0]}
    assert [r.getMessage() for r in caplog.records if "claims" in r.getMessage()] == [
        "client 1: node 30 claims it while node 12, which serves it, is still connected: refused (two devices with the "
        "same client id or data?); it moves to node 30 only once node 12 is gone"]
    assert 30 not in m.asked  # asked again at the next round
    caplog.clear()
    # a node that connects later claims client 2 while node 12 still answers: refused, with one line naming both
    grid = Grid({12: {"client-ids": [1, 2]}, 30: {"client-ids": [0, 1]}, 40: {"client-ids": [2]}})
    m.refresh(grid, timeout=1)
    assert m.node[2] == 12 and m.node[1] == 12, m.node
    assert any("client 2: node 40 claims it while node 12" in r.getMessage() for r in caplog.records)
    caplog.clear()
    # node 12 is gone (a restart): the next round's refresh asks node 40 (and 30) again and the clients move
    grid = Grid({30: {"client-ids": [0, 1]}, 40: {"client-ids": [2]}})
    m.refresh(grid, timeout=1)
    assert m.node == {0: 30, 1: 30, 2: 40} and m.online(grid) == [0, 1, 2]
    assert sorted(r.getMessage() for r in caplog.records if "moved" in r.getMessage()) == [
        "client 1 moved from node 12 to node 30", "client 2 moved from node 12 to node 40"]


def test_discovery_asks_nodes_in_bounded_batches(task_identity):
    answers = {100 + n: one(n) for n in range(25)}
    grid = Grid(answers)
    got = ask_nodes(grid, sorted(answers), timeout=5, batch=10)
    assert [len(b) for b in grid.batches] == [10, 10, 5]  # never more than `batch` messages stored at once
    assert {int(a["client-ids"][0]) for a in got.values()} == set(range(25))


def test_send_keeps_one_message_in_flight_per_node_and_names_each_replys_client(task_identity):
    cmap = ClientMap({10: {"client-ids": [0, 2, 4]}, 11: {"client-ids": [1, 3]}})

    def train(msg):
        c = int(msg.content["client"]["client-id"])
        return Message(RecordDict({"metrics": MetricRecord({"c": c})}), reply_to=msg)

    grid = Grid({10: {}, 11: {}}, train)
    content = RecordDict({"config": ConfigRecord({"x": 1})})
    msgs = [cmap.message(c, content, "train") for c in (0, 1, 2, 3, 4)]
    assert [m.metadata.dst_node_id for m in msgs] == [10, 11, 10, 11, 10]
    assert all(m.content["config"] is content["config"] for m in msgs)  # shared records are not copied
    replies = cmap.send_and_receive(grid, msgs, timeout=5)
    assert [sorted(b) for b in grid.batches] == [[10, 11], [10, 11], [10]]  # waves: one message per node at a time
    assert sorted(cmap.client_of(r) for r in replies) == [0, 1, 2, 3, 4]
    assert all(cmap.client_of(r) == r.content["metrics"]["c"] for r in replies)


def _reply(msg, arrays, n=5):
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                               "metrics": MetricRecord({"num-examples": n})}), reply_to=msg)


def test_seeded_fedavg_samples_by_client_id_and_rejects_malformed_replies(task_identity):
    nodes = {1000 + 7 * c: one(c) for c in range(10)}
    cmap = ClientMap(nodes)
    s = SeededFedAvg(fraction_train=0.3, fraction_evaluate=0.0, min_available_nodes=1).bind(cmap, seed=4)
    w = {"w": np.zeros((2, 2), np.float32)}
    msgs = list(s.configure_train(1, ArrayRecord({k: Array(v) for k, v in w.items()}), ConfigRecord(), Grid(nodes)))
    assert s.sampled == sample_clients(range(10), 3, 4, 1)
    assert sorted(m.metadata.dst_node_id for m in msgs) == sorted(1000 + 7 * c for c in s.sampled)
    values = {s.sampled[0]: 1.0, s.sampled[1]: 3.0, s.sampled[2]: np.nan}

    def train(m):
        return _reply(m, {"w": np.full((2, 2), values[int(m.content["client"]["client-id"])], np.float32)})

    replies = cmap.send_and_receive(Grid(nodes, train), msgs, timeout=5)
    arrays, _ = s.aggregate_train(1, s.order_replies(replies))
    assert s.rejected == 1
    np.testing.assert_allclose(arrays["w"].numpy(), 2.0)  # the NaN reply never reached the average


def test_seeded_fedprox_keeps_flower_fedprox_config_and_seeded_sampling(task_identity):
    nodes = {300 + c: one(c) for c in range(6)}
    s = SeededFedProx(proximal_mu=0.3, fraction_train=0.5, fraction_evaluate=0.0, min_available_nodes=1)
    msgs = list(s.bind(ClientMap(nodes), seed=9).configure_train(
        2, ArrayRecord({"w": Array(np.zeros(2, np.float32))}), ConfigRecord(), Grid(nodes)))
    assert sorted(m.metadata.dst_node_id - 300 for m in msgs) == sample_clients(range(6), 3, 9, 2)
    assert all(m.content["config"]["proximal-mu"] == pytest.approx(0.3) for m in msgs)


@pytest.mark.parametrize("arrival", [[0, 1, 2], [2, 0, 1], [1, 2, 0]])
def test_replies_are_aggregated_in_client_order_whatever_the_arrival(arrival, task_identity):
    nodes = {500 - c: one(c) for c in range(3)}
    cmap = ClientMap(nodes)
    s = SeededFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1).bind(cmap, 0)
    msgs = list(s.configure_train(1, ArrayRecord({"w": Array(np.zeros(3, np.float32))}), ConfigRecord(), Grid(nodes)))

    def train(m):
        c = int(m.content["client"]["client-id"])
        return _reply(m, {"w": np.full(3, 0.1 * (c + 1), np.float32)}, n=c + 1)

    replies = cmap.send_and_receive(Grid(nodes, train), msgs, timeout=5)
    ordered = s.order_replies([replies[i] for i in arrival])
    assert [r.metadata.src_node_id for r in ordered] == [500, 499, 498]


def test_fedavg_keeps_integer_buffers_integer_and_rejects_replies_flower_could_not_aggregate(task_identity):
    """BatchNorm's num_batches_tracked is int64: Flower averages it into float64, which the next round's dtype check
    would then hold against every client; and replies whose records or metric keys differ would make Flower's
    aggregation raise. Both are handled: the dtype is kept, the odd reply is rejected."""
    nodes = {100 + c: one(c) for c in range(3)}
    cmap = ClientMap(nodes)
    s = SeededFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1).bind(cmap, 0)
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32)), "n": Array(np.array(3, np.int64))})
    for rnd in (1, 2):
        msgs = list(s.configure_train(rnd, arrays, ConfigRecord(), Grid(nodes)))

        def train(m):
            c = int(m.content["client"]["client-id"])
            metrics = {"num-examples": c + 1, **({"extra": 1.0} if c == 2 else {})}  # client 2 adds a metric key
            return Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.ones(2, np.float32)),
                                                              "n": Array(np.array(4 + c, np.int64))}),
                                       "metrics": MetricRecord(metrics)}), reply_to=m)

        arrays, _ = s.aggregate_train(rnd, s.order_replies(cmap.send_and_receive(Grid(nodes, train), msgs, timeout=5)))
        assert s.rejected == 1 and arrays["n"].numpy().dtype == np.int64, rnd  # round 2 accepts clients 0 and 1 again
        assert int(arrays["n"].numpy()) == 5  # (4 * 1 + 5 * 2) / 3 = 4.67, rounded


def test_a_malformed_discovery_answer_leaves_that_node_out(task_identity):
    m = ClientMap({1: one(0), 2: {"client-id": 1}, 3: {"client-ids": [2], "tier": ["weak", "strong"]}})
    assert m.node == {0: 1} and m.asked == {1, 2, 3}
    grid = Grid({1: one(0), 2: {"client-id": 1}, 3: one(2), 4: one(3)})
    m.refresh(grid, timeout=1)
    assert grid.asked == [4] and m.node == {0: 1, 3: 4}  # nodes that answered badly are not asked every round


def test_a_node_whose_message_timed_out_gets_no_new_message_until_it_answers(task_identity, caplog):
    """At most one message in flight per node across rounds: a message that got no reply in its round may still be
    running on its node; the next round skips that node's client until the SuperLink has its late reply."""
    caplog.set_level("WARNING", logger="hetfl")
    late: dict[str, Message] = {}

    class SlowGrid(Grid):
        def __init__(self, answers):
            super().__init__(answers, train=lambda m: Message(RecordDict({"config": ConfigRecord({})}), reply_to=m))
            self.slow, self.pulled = {12}, []

        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            out = super().send_and_receive(messages, timeout=timeout)
            kept = [r for r in out if r.metadata.reply_to_message_id not in
                    {m.metadata.message_id for m in messages if m.metadata.dst_node_id in self.slow}]
            for m in messages:
                if m.metadata.dst_node_id in self.slow:
                    late[m.metadata.message_id] = Message(RecordDict({"config": ConfigRecord({})}), reply_to=m)
            return kept

        def pull_messages(self, message_ids):
            self.pulled.append(list(message_ids))
            return [late[i] for i in message_ids if i in late and not self.slow]

    grid = SlowGrid({12: one(0), 30: one(1)})
    m = ClientMap({12: one(0), 30: one(1)})
    send = lambda: m.send_and_receive(grid, [m.message(c, RecordDict({}), "train") for c in (0, 1)], timeout=1)  # noqa: E731
    assert [m.client_of(r) for r in send()] == [1]  # round 1: node 12's reply does not come in time
    assert [m.client_of(r) for r in send()] == [1]  # round 2: node 12 still runs it: client 0 is not sent
    assert any("client(s) [0] not sent: node 12 still runs a message" in r.getMessage() for r in caplog.records)
    assert grid.batches[-1] == [30]
    grid.slow = set()  # node 12's late reply reaches the SuperLink
    assert sorted(m.client_of(r) for r in send()) == [0, 1]  # round 3: node 12 is free again
    assert m.pending == {}


class _SlowToStart(Grid):
    """Nodes in `late` send no reply to the first discovery query (their ClientApp still starting), then answer."""

    def __init__(self, answers, late):
        super().__init__(answers)
        self.late = set(late)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        silent = {m.metadata.dst_node_id for m in messages} & self.late
        self.late -= silent
        return [r for r in super().send_and_receive(messages, timeout=timeout)
                if r.metadata.src_node_id not in silent]


def test_a_node_silent_at_discovery_is_asked_again_and_keeps_its_declared_clients(task_identity, caplog):
    """A node with no reply within the query timeout is not made a plain client (numbered by node id): discovery
    asks it again before the map is made, and it declares its own clients, as on an idle machine."""
    from hetfl.common.nodes import map_clients

    answers = {900: one(0), 100: one(1), 500: one(2), 300: one(3)}
    idle = map_clients(Grid(answers), timeout=5, query_timeout=1)
    busy_grid = _SlowToStart(answers, late={900, 300})
    busy = map_clients(busy_grid, timeout=5, query_timeout=1)
    assert "2 of 4 node(s) sent no reply" in caplog.text
    assert busy.node == idle.node == {0: 900, 1: 100, 2: 500, 3: 300} and busy.asked == idle.asked
    assert sorted(busy_grid.asked) == [100, 300, 300, 500, 900, 900]  # the silent two asked twice, the others once


def test_a_node_silent_twice_is_left_out_with_a_line_that_says_so(task_identity):
    from hetfl.common.nodes import map_clients

    class Hung(_SlowToStart):  # node 300 never answers
        def send_and_receive(self, messages, *, timeout=None):
            self.late.add(300)
            return super().send_and_receive(messages, timeout=timeout)

    cmap = map_clients(Hung({100: one(0), 300: one(1)}, late={300}), timeout=5, query_timeout=1, plain_are_clients=False)
    assert cmap.node == {0: 100} and cmap.left_out == {300: "no reply to the discovery query within 1 s, nor within 5 s "
                                                            "when asked again"}
