import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from hetfl.common.comm import MeteredGrid, decode_sparse, densify, encode_sparse, get_sparse, put_sparse, record_nbytes


@pytest.mark.parametrize("size,k", [(100_000, 10_000), (100_000, 500), (60_000, 200), (10, 0), (1, 1), (70_000, 70_000)])
def test_sparse_codec_roundtrips_exactly(size, k):
    rng = np.random.default_rng(size + k)
    idx = rng.choice(size, k, replace=False)
    val = rng.standard_normal(k).astype(np.float32)
    enc = encode_sparse(idx, val, size)
    i2, v2, s2 = decode_sparse(enc)
    order = np.argsort(idx)
    assert s2 == size and np.array_equal(i2, idx[order]) and np.array_equal(v2, val[order])
    dense = np.zeros(size, np.float32)
    dense[idx] = val
    assert np.array_equal(densify(enc), dense)


def test_sparse_codec_picks_the_smallest_position_format():
    size = 1_000_000
    dense_k = encode_sparse(np.arange(0, size, 10), np.ones(size // 10), size)  # 10%: bitmap
    assert dense_k["pos"].nbytes == size // 8
    sparse_k = encode_sparse(np.arange(0, size, 100), np.ones(size // 100), size)  # 1%: uint32
    assert sparse_k["pos"].dtype == np.uint32
    small = encode_sparse(np.arange(0, 60_000, 100), np.ones(600), 60_000)  # fits uint16
    assert small["pos"].dtype == np.uint16


def test_sparse_codec_rejects_bad_input():
    with pytest.raises(ValueError, match="out of range"):
        encode_sparse(np.array([5]), np.array([1.0]), 5)
    with pytest.raises(ValueError, match="unique"):
        encode_sparse(np.array([1, 1]), np.array([1.0, 2.0]), 5)
    enc = encode_sparse(np.array([1, 3]), np.array([1.0, 2.0]), 70_000)
    enc["pos"] = np.array([1, 80_000], dtype=np.uint32)
    with pytest.raises(ValueError, match="corrupt"):
        decode_sparse(enc)


def test_serialized_bytes_match_payload_and_sparse_is_smaller():
    rng = np.random.default_rng(0)
    d = 1_000_000
    w = rng.standard_normal(d).astype(np.float32)
    dense = ArrayRecord({"w": Array(w)})
    dense_bytes = record_nbytes(dense)
    assert 4 * d <= dense_bytes <= 4 * d + 2048  # raw float32 + small headers
    idx = np.argpartition(np.abs(w), -d // 10)[-d // 10:]
    sparse = ArrayRecord()
    put_sparse(sparse, "w", encode_sparse(idx, w[idx], d))
    sparse_bytes = record_nbytes(sparse)
    assert sparse_bytes <= 0.2 * dense_bytes  # k = 0.1 d: 0.4 d values + d/8 bitmap = 0.131x
    assert np.array_equal(densify(get_sparse(sparse, "w"))[idx], w[idx])


class FakeGrid:
    """Echoes every message back as a reply carrying an array of 100 float32 values."""

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            rep = RecordDict({"arrays": ArrayRecord({"u": Array(np.ones(100, np.float32))}), "metrics": MetricRecord({"n": 1})})
            out.append(Message(rep, reply_to=m))
        return out

    def get_node_ids(self):
        return [1, 2, 3]


def test_metered_grid_counts_both_directions_per_node(task_identity):
    grid = MeteredGrid(FakeGrid())
    content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(10_000, np.float32))}), "config": ConfigRecord({"lr": 0.1})})
    msgs = [Message(content, dst_node_id=n, message_type="train") for n in (1, 2, 3)]
    replies = grid.send_and_receive(msgs)
    assert len(replies) == 3 and list(grid.get_node_ids()) == [1, 2, 3]
    t = grid.take()
    one_down = record_nbytes(content)
    assert set(t.down) == {1, 2, 3} and all(v >= one_down for v in t.down.values())
    assert t.bytes_down == sum(t.down.values()) and 3 * one_down <= t.bytes_down <= 3 * one_down + 600
    assert t.replies == 3 and t.failures == 0 and 3 * 400 <= t.bytes_up <= 3 * 1500
    assert grid.take().bytes_down == 0  # a new period starts empty
    assert grid.total_bytes() == (t.bytes_down, t.bytes_up)


class HostGrid(FakeGrid):
    """FakeGrid whose replies name the host `hosts[node]` that computed them, as hetfl.common.comm.tag_host does."""

    def __init__(self, hosts):
        self.hosts = hosts

    def send_and_receive(self, messages, *, timeout=None):
        from hetfl.common.comm import HOST

        out = super().send_and_receive(messages)
        for m, r in zip(messages, out):
            r.content[HOST] = ConfigRecord({HOST: self.hosts[m.metadata.dst_node_id]})
        return out


def test_metered_grid_tallies_replies_per_host_and_counts_no_byte_of_the_tag(task_identity):
    """Each reply names the host that computed it (docs/ray-cluster.md); the grid tallies the hosts per period and
    takes the tag off before counting bytes and before any strategy reads the reply."""
    import socket

    from hetfl.common.comm import HOST, host_name, tag_host

    content = RecordDict({"config": ConfigRecord({"lr": 0.1})})
    msgs = lambda: [Message(content, dst_node_id=n, message_type="train") for n in (1, 2, 3)]  # noqa: E731
    plain = MeteredGrid(FakeGrid())
    plain.send_and_receive(msgs())
    untagged = plain.take()
    grid = MeteredGrid(HostGrid({1: "10.78.0.1", 2: "10.78.0.2", 3: "10.78.0.1"}))
    replies = grid.send_and_receive(msgs())
    t = grid.take()
    assert dict(t.hosts) == {"10.78.0.1": 2, "10.78.0.2": 1}
    assert all(HOST not in r.content for r in replies)  # the strategies never see it
    assert t.up == untagged.up and t.bytes_up == untagged.bytes_up  # same bytes as without the tag
    assert dict(t.add(t).hosts) == {"10.78.0.1": 4, "10.78.0.2": 2}
    # outside Ray (deployment SuperNodes, in-process grids) a ClientApp names its machine by hostname
    host_name.cache_clear()
    reply = tag_host(Message(RecordDict({}), reply_to=msgs()[0]))
    assert reply.content[HOST][HOST] == host_name() == socket.gethostname()


class FailingGrid(FakeGrid):
    """FakeGrid where node 2's reply is the SuperLink's stand-in for a node that missed its heartbeats and node 3's
    ClientApp raised."""

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Error
        from flwr.common.constant import ErrorCode

        codes = {2: ErrorCode.NODE_UNAVAILABLE, 3: ErrorCode.CLIENT_APP_RAISED_EXCEPTION}
        return [Message(Error(codes[m.metadata.dst_node_id], "x"), reply_to=m) if m.metadata.dst_node_id in codes
                else r for m, r in zip(messages, super().send_and_receive(messages))]


def test_metered_grid_names_each_failure_by_flowers_error_code(task_identity):
    """A round's failures carry their reasons (the ``errors`` column): an unavailable node is told apart from a
    ClientApp that raised, and periods fold them together."""
    grid = MeteredGrid(FailingGrid())
    msgs = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in (1, 2, 3)]
    grid.send_and_receive(msgs)
    t = grid.take()
    assert (t.replies, t.failures) == (1, 2)
    assert dict(t.errors) == {"NODE_UNAVAILABLE": 1, "CLIENT_APP_RAISED_EXCEPTION": 1}
    grid.send_and_receive(msgs[1:2])
    assert dict(t.add(grid.take()).errors) == {"NODE_UNAVAILABLE": 2, "CLIENT_APP_RAISED_EXCEPTION": 1}
