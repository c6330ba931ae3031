"""hetfl.superexec: a SuperNode's ClientApps start warm (forked from its SuperExec, PyTorch loaded) and still run the
submitted app's own code, not the modules the SuperExec imported."""

from __future__ import annotations

import json

import pytest

from hetfl import cluster, launch

# A probe app whose package is also called `hetfl`: if the warm process's own `hetfl` modules were used, its
# ClientApp would be the project's (hetfl.client_app is not hetfl.client) and every reply would be an error.
SERVER = """\
import json
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    while len(list(grid.get_node_ids())) < int(cfg["nodes"]):
        time.sleep(0.2)
    msgs = [Message(RecordDict({"c": ConfigRecord({"x": 1})}), dst_node_id=n, message_type="train")
            for n in grid.get_node_ids()]
    out = []
    for _ in range(2):  # two messages per node: each a process of its own
        out += [{"error": m.error.reason} if m.has_error() else dict(m.content["m"])
                for m in grid.send_and_receive(msgs)]
    with open(cfg["out"], "w") as f:
        json.dump(out, f)
"""

CLIENT = """\
import os
import sys

PRELOADED = "torch" in sys.modules  # before this app imported anything itself

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"m": MetricRecord({"pid": os.getpid(), "ppid": os.getppid(),
                                                  "torch": int(PRELOADED)})}), reply_to=msg)
"""


@pytest.mark.slow
def test_clientapps_start_warm_from_the_superexec_and_run_the_submitted_apps_code(tmp_path):
    app = launch.write_app(tmp_path / "probe", "hetfl", SERVER, CLIENT, {"nodes": 2, "out": ""})
    out = tmp_path / "replies.json"
    with cluster.local_cluster(2, tmp_path / "flwr", state_file=False) as c:
        import psutil

        # both nodes' SuperExecs forked from the cluster's one warm pool
        assert set(c.execs) == {0, 1} and c.pool is not None
        assert {psutil.Process(c.execs[i].pid).ppid() for i in c.execs} == {c.pool.proc.pid}
        rc = launch.flwr_run(c.link, app, None, {"nodes": 2, "out": str(out)}, None, timeout=300)
        assert rc == 0 and out.exists(), (rc, (tmp_path / "flwr" / "supernode-0.log").read_text()[-3000:])
        warm = {c.execs[i].pid for i in c.execs}
        logs = "".join((tmp_path / "flwr" / f"supernode-{i}.log").read_text() for i in c.execs)
    replies = json.loads(out.read_text())
    assert len(replies) == 4 and all("error" not in r for r in replies), replies  # the FAB's own `hetfl` package ran
    assert {r["ppid"] for r in replies} == warm, (replies, warm)  # forked by the nodes' warm SuperExecs
    assert all(r["torch"] == 1 for r in replies), replies  # PyTorch was loaded before the app's code ran
    assert len({r["pid"] for r in replies}) == 4  # still a process per message, as Flower's executor does it
    assert logs.count("ClientApp in warm process") >= 4, logs[-2000:]
