"""The one reply check against every strategy: a battery of malformed replies in round 1 (docs/architecture.md).

Each method runs in-process (real ServerApp and ClientApp code, tests/inprocess.py) with 10 clients,
all sampled in round 1, and the grid spoils round 1's replies: an error reply, a missing array
record, missing metrics, a wrong shape, a wrong dtype, NaN, a duplicate of a good reply and a reply
to a message that was never sent. Each is counted (failed or rejected), none is applied, and the
run goes on to round 2.
"""

import json
import uuid

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.error import Error

from hetfl.common.registry import NODE_QUERY
from hetfl.inprocess import InProcessGrid, run_in_process

from .conftest import require_fmnist
from .test_determinism import BASE, setting

MALFORMED = ("missing-record", "missing-metrics", "wrong-shape", "wrong-dtype", "nan")  # each rejected by the check
EXTRA = ("duplicate", "unsent")  # rejected as replies to no message of the round / a second reply


def _rebuilt(reply: Message, content: RecordDict) -> Message:
    """`reply` with other content, still answering the same message."""
    ask = Message(RecordDict(), message_type=reply.metadata.message_type, dst_node_id=reply.metadata.src_node_id)
    ask.metadata.__dict__["_message_id"] = reply.metadata.reply_to_message_id
    return Message(content, reply_to=ask)


def _largest(rec: ArrayRecord) -> str:
    return max(rec.keys(), key=lambda k: rec[k].numpy().size)


def spoil(reply: Message, how: str) -> Message:
    records = dict(reply.content.items())
    arrays = next(k for k, v in records.items() if isinstance(v, ArrayRecord))
    metrics = next(k for k, v in records.items() if isinstance(v, MetricRecord))
    if how == "missing-record":
        records.pop(arrays)
    elif how == "missing-metrics":
        records.pop(metrics)
    else:
        rec = ArrayRecord({k: Array(v.numpy().copy()) for k, v in records[arrays].items()})
        if not len(rec):  # nothing trained (AdaptiveFL: no pool member fit): any array is one too many
            rec["extra"] = Array(np.zeros(3, np.float32))
        key = _largest(rec)
        a = rec[key].numpy()
        if how == "wrong-shape":
            a = np.concatenate([a.reshape(-1), a.reshape(-1)[:1]])
        elif how == "wrong-dtype":
            a = a.astype(np.int32)
        elif how == "nan":
            a = a.copy()
            a.reshape(-1)[0] = np.nan
        rec[key] = Array(a)
        records[arrays] = rec
    return _rebuilt(reply, RecordDict(records))


class SpoilingGrid(InProcessGrid):
    """Spoils the replies of the first train batch (the 8 smallest client ids in the message order it got)."""

    spoiled = False

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        if self.spoiled or any(m.metadata.message_type == NODE_QUERY for m in messages) or len(replies) < 9:
            return replies
        self.spoiled = True
        by_id = {r.metadata.reply_to_message_id: r for r in replies}
        ordered = [by_id[m.metadata.message_id] for m in messages]
        out = [Message(Error(code=0, reason="boom\nTraceback (most recent call last): ..."), reply_to=_ask(ordered[0]))]
        out += [spoil(r, how) for r, how in zip(ordered[1:], MALFORMED)]
        good = ordered[1 + len(MALFORMED):]
        ghost = Message(RecordDict(), message_type=good[0].metadata.message_type, dst_node_id=good[0].metadata.src_node_id)
        ghost.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # a message this round never sent
        out += good + [good[0], Message(good[1].content, reply_to=ghost)]
        return out


def _ask(reply: Message) -> Message:
    ask = Message(RecordDict({"config": ConfigRecord({})}), message_type=reply.metadata.message_type,
                  dst_node_id=reply.metadata.src_node_id)
    ask.metadata.__dict__["_message_id"] = reply.metadata.reply_to_message_id
    return ask


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedadam", "fedyogi", "fednova", "scaffold", "fedavg-stc", "shefl",
                                  "adaptivefl", "fens"])
def test_every_malformed_reply_is_counted_and_never_applied(name, tmp_path, task_identity, monkeypatch):
    require_fmnist()
    cfg = {**setting(name)[0], "fraction-train": 1.0, "min-available-nodes": 10, "seed": 1}
    if name == "shefl":
        cfg.update({"shefl-hpc-per-round": 5, "shefl-topk-density": 0.5})
    monkeypatch.setattr("hetfl.inprocess.InProcessGrid", SpoilingGrid)
    m = run_in_process(cfg, 10, tmp_path, name)
    rows = m["rounds"]
    assert [r["round"] for r in rows] == [0, 1, 2]  # the run went on
    if name == "fens":  # round "1" of the battery is phase 1: the ensemble keeps only the good models
        assert m["phases"]["rejected_models"] == len(MALFORMED) + len(EXTRA)
        assert m["phases"]["num_models"] == 10 - 1 - len(MALFORMED)
    else:
        assert rows[1]["rejected"] == len(MALFORMED) + len(EXTRA), rows[1]
        assert rows[1].get("failures", 0) + rows[1].get("failed", 0) >= 1, rows[1]
    assert np.isfinite(rows[2]["accuracy"]) and np.isfinite(rows[2]["loss"])
    if name == "scaffold":  # the nodes whose replies were dropped had changed their c_i: round 2 resends it
        assert rows[2]["failures"] == 0 and rows[2]["rejected"] == 0, rows[2]


@pytest.mark.parametrize("idle_rounds", [2, 0])
def test_a_run_where_no_client_succeeds_stops_with_a_clear_error(idle_rounds, tmp_path, task_identity, monkeypatch):
    """Every node's data is unusable (here: the ClientApp raises the node-data error): each round's failures are
    logged in one line and counted. With max-idle-rounds = 2 the run stops after 2 rounds without one accepted
    update; with it off (0) the run reaches its last round, but it never trained, so it ends as failed all the
    same. Either way: NoClientSucceeded with the reason, ``stopped`` in metrics.json (which the launcher and
    ``hetfl.cluster --submit`` turn into a non-zero exit), never a completed run at chance accuracy."""
    require_fmnist()
    from hetfl import launch
    from hetfl.baselines import client_app
    from hetfl.common.results import NoClientSucceeded
    from hetfl.data.byo import LocalDataError

    def no_data(context, cfg, client_id=None):
        raise LocalDataError("node data-path '/data': label 12 outside [0, 10)")

    monkeypatch.setattr(client_app, "client_data", no_data)
    rounds = 5 if idle_rounds else 2
    cfg = {**BASE, "method": "fedavg", "num-server-rounds": rounds, "max-idle-rounds": idle_rounds, "min-available-nodes": 4}
    why = "no client update was accepted in the last 2 rounds" if idle_rounds else "in any of the run's 2 round"
    with pytest.raises(NoClientSucceeded, match=why):
        run_in_process(cfg, 4, tmp_path, "idle")
    # the stop is the run's outcome, kept with its rows and plot; the reproduce script counts it as done (not rerun)
    from .test_results import _reproduce_script

    data = json.loads((tmp_path / "idle" / "metrics.json").read_text())
    assert data["stopped"]["round"] == 2, data.get("stopped")
    assert ("max-idle-rounds" in data["stopped"]["reason"]) == bool(idle_rounds), data["stopped"]
    assert [r["round"] for r in data["rounds"]] == ([0, 1] if idle_rounds else [0, 1, 2])
    assert (tmp_path / "idle" / "accuracy.png").exists() and _reproduce_script().finished(tmp_path / "idle" / "metrics.json")
    with pytest.raises(RuntimeError, match="max-idle-rounds" if idle_rounds else "never trained"):
        launch.check_outcome(data)


def test_replies_of_clients_without_data_are_not_accepted_updates(tmp_path, task_identity, monkeypatch):
    """Every client holds no rows, so every reply weighs 0: such a reply trains nothing and is not an accepted update,
    so max-idle-rounds stops a federation of empty clients (it used to count them and run forever)."""
    require_fmnist()
    from hetfl.baselines import client_app
    from hetfl.common.results import NoClientSucceeded
    from hetfl.data.arrays import ArrayData

    real = client_app.client_data

    def empty(context, cfg, client_id=None):
        d = real(context, cfg, client_id)
        return ArrayData(d.x[:0], d.y[:0])

    monkeypatch.setattr(client_app, "client_data", empty)
    cfg = {**BASE, "method": "fedavg", "num-server-rounds": 5, "max-idle-rounds": 2, "min-available-nodes": 4}
    with pytest.raises(NoClientSucceeded, match="in the last 2 rounds"):
        run_in_process(cfg, 4, tmp_path, "empty")
    rows = json.loads((tmp_path / "empty" / "metrics.json").read_text())["rounds"]
    assert rows[1]["replies"] == len(rows[1]["clients"]) > 0 and rows[1]["accepted"] == 0, rows[1]  # all answered; none accepted
