"""A deployment round against Flower's own floor, on one cluster (docs/deployment.md#round-cost).

One SuperLink and N SuperNodes on this machine (Flower 1.41 starts one ``flwr-clientapp`` process per message).
On that cluster, in turn:

* ``floor``: a minimal Flower app whose ClientApp returns at once (imports only Flower): what any app pays a round;
* ``floor+torch``: the same ClientApp importing torch first (what any PyTorch app pays);
* ``floor, fast pull`` (with ``--fast-pull``): the floor app, its server pulling replies after 0.2 s, then waits growing by half up to 1 s
  (starting over after each pull that brought a reply), instead of Flower's ``send_and_receive`` (a pull every 3 s):
  whether a ServerApp that polls faster makes a round shorter (it does not: docs/deployment.md#round-cost);
* ``hetfl``: the quickstart preset (FedAvg, CNN, Fashion-MNIST) with ``local-steps`` 2 and full participation.

Then, on a second cluster whose SuperNodes start their ClientApps from hetfl's warm SuperExec (``hetfl.superexec``:
forked from a process with PyTorch loaded), ``floor`` and ``hetfl`` again.

Each runs `--rounds` rounds; the table gives every round's seconds (round 1 included; the median of rounds >= 2 is
the steady state). Run it alone on the machine.

    python scripts/deploy_floor.py [--nodes 3] [--rounds 4] [--fast-pull] [--out docs/results/deploy-floor.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hetfl import cluster, launch  # noqa: E402

SERVER = """\
import json
import time

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def fast_pull(grid, msgs, first=0.2, longest=1.0):
    ids, replies, wait = set(grid.push_messages(msgs)), [], first
    while ids:
        got = list(grid.pull_messages(ids))
        replies += got
        ids -= {r.metadata.reply_to_message_id for r in got}
        if ids:
            wait = first if got else wait
            time.sleep(wait)
            wait = min(wait * 1.5, longest)
    return replies


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    while len(list(grid.get_node_ids())) < int(cfg["nodes"]):
        time.sleep(0.2)
    nodes = list(grid.get_node_ids())
    rounds = []
    for r in range(int(cfg["rounds"])):
        t0 = time.perf_counter()
        msgs = [Message(RecordDict({"config": ConfigRecord({"round": r})}), dst_node_id=n, message_type="train")
                for n in nodes]
        if cfg["poll"]:
            replies = fast_pull(grid, msgs)
        else:
            replies = list(grid.send_and_receive(msgs))
        rounds.append({"round": r + 1, "round_s": time.perf_counter() - t0,
                       "replies": sum(not m.has_error() for m in replies)})
    with open(cfg["out"], "w") as f:
        json.dump(rounds, f)
"""

CLIENT = """\
{imports}from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)
"""


def floor_app(root: Path, torch: bool) -> Path:
    return launch.write_app(root, "floorapp", SERVER, CLIENT.format(imports="import torch  # noqa: F401\n" if torch else ""),
                            {"rounds": 4, "nodes": 3, "out": "", "poll": False})


def run_floor(c: cluster.Cluster, torch: bool, nodes: int, rounds: int, tmp: Path, poll: bool = False) -> list[dict]:
    name = f"floor{'-torch' if torch else ''}{'-poll' if poll else ''}"
    app = floor_app(tmp / name, torch)
    out = tmp / f"{name}.json"
    rc = launch.flwr_run(c.link, app, None, {"rounds": rounds, "nodes": nodes, "out": str(out), "poll": poll}, None,
                         timeout=900)
    if rc != 0 or not out.exists():
        raise RuntimeError(f"the floor app failed (flwr exit {rc})")
    return json.loads(out.read_text())


def run_hetfl(c: cluster.Cluster, nodes: int, rounds: int, tmp: Path) -> list[dict]:
    over = {"min-available-nodes": nodes, "num-server-rounds": rounds, "local-steps": 2, "fraction-train": 1.0,
            "max-test-samples": 200, "checkpoint": False, "tracking": "none", "run-name": "hetfl-2steps"}
    run_dir = cluster.submit(c, "configs/quickstart.toml", over, results_dir=tmp, timeout=900)
    rows = json.loads((run_dir / "metrics.json").read_text())["rounds"][1:]
    return [{"round": r["round"], "round_s": r["round_s"], "replies": r["replies"], "eval_s": r.get("eval_s")}
            for r in rows]


def main() -> int:
    p = argparse.ArgumentParser(prog="python scripts/deploy_floor.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default="docs/results/deploy-floor.json")
    p.add_argument("--fast-pull", action="store_true", help="also the floor app with a server that pulls sooner")
    a = p.parse_args()
    from hetfl.common.results import machine_info

    result: dict = {"machine": machine_info(), "nodes": a.nodes, "rounds": a.rounds}
    cases = {False: [("floor", lambda c, tmp: run_floor(c, False, a.nodes, a.rounds, tmp)),
                     *([("floor, fast pull", lambda c, tmp: run_floor(c, False, a.nodes, a.rounds, tmp, poll=True))]
                       if a.fast_pull else []),
                     ("floor+torch", lambda c, tmp: run_floor(c, True, a.nodes, a.rounds, tmp)),
                     ("hetfl", lambda c, tmp: run_hetfl(c, a.nodes, a.rounds, tmp))],
             True: [("floor, warm SuperExec", lambda c, tmp: run_floor(c, False, a.nodes, a.rounds, tmp)),
                    ("hetfl, warm SuperExec", lambda c, tmp: run_hetfl(c, a.nodes, a.rounds, tmp))]}
    for warm, runs in cases.items():  # Flower's SuperExec, then hetfl.superexec: one cluster each
        with tempfile.TemporaryDirectory() as d, cluster.local_cluster(a.nodes, Path(d) / "flwr", warm=warm) as c:
            for name, fn in runs:
                t0 = time.perf_counter()
                rows = fn(c, Path(d))
                result[name] = {"rounds": rows, "run_s": time.perf_counter() - t0,
                                "steady_median_s": statistics.median(r["round_s"] for r in rows[1:])}
                print(f"{name:>22}: " + " ".join(f"{r['round_s']:.1f}" for r in rows) + " s a round", flush=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
