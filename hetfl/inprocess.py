"""Run a whole method in one process: the real ServerApp and ClientApp code over an in-process Grid.

Like Flower's engines, every "run" gives its nodes fresh random node ids and returns replies in
an arbitrary (here: shuffled) order, so a test can show that results depend on the seed only.
Messages are handed over as objects (no network), which keeps a 2-round run of any method at a
few seconds; byte counts still come from the real serialization (MeteredGrid). The tests use it,
and so does the FENS aggregator sweep (``python scripts/fens_sweep.py``), where hundreds of
cheap aggregator rounds would otherwise be dominated by the Simulation Engine's per-round overhead.
"""

from __future__ import annotations

import contextlib
import json
import random
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.common.constant import ErrorCode

from hetfl.client_app import dispatch, node_query
from hetfl.common.registry import NODE_QUERY
from hetfl.common.results import metrics_text


@contextlib.contextmanager
def task_identity() -> Iterator[None]:
    """Flower 1.41 Messages need a run/node identity in the creating process (the engines set it); restored after."""
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = old


class InProcessGrid:
    """`num_nodes` nodes with partitions 0..n-1 behind random node ids; shuffled replies."""

    simulated = True  # a simulation: measured device timing decides nothing here (hetfl.common.nodes.simulated)

    def __init__(self, run_config: dict[str, Any], num_nodes: int, callbacks: Sequence[Any] = ()) -> None:
        """`callbacks`: round callbacks (:class:`hetfl.common.rounds.RoundCallback`) the run adds to its own."""
        self.callbacks = tuple(callbacks)
        self._rng = random.Random()  # unseeded on purpose: node ids and reply order differ in every run
        ids = self._rng.sample(range(1, 1 << 62), num_nodes)
        self.contexts = {
            nid: Context(run_id=1, node_id=nid, node_config={"partition-id": i, "num-partitions": num_nodes},
                         state=RecordDict(), run_config=dict(run_config))
            for i, nid in enumerate(ids)
        }

    def get_node_ids(self) -> list[int]:
        ids = list(self.contexts)
        self._rng.shuffle(ids)
        return ids

    def send_and_receive(self, messages, *, timeout: float | None = None) -> list[Message]:
        """Each message through the ClientApp's handler; the server's torch thread count is restored after them, as
        if each ClientApp had run in a process of its own (a client's `client-threads` would otherwise change the
        server's evaluation in its last bits: task.server_threads)."""
        import torch

        replies, threads = [], torch.get_num_threads()
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # as Flower's grids do when pushing
            handler = node_query if m.metadata.message_type == NODE_QUERY else dispatch
            try:
                replies.append(handler(m, self.contexts[m.metadata.dst_node_id]))
            except Exception as ex:  # noqa: BLE001 - as Flower's engines do: the ClientApp's exception as an error reply
                replies.append(Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                             reason=f"{type(ex)}:<'{ex}'>"), reply_to=m))
        torch.set_num_threads(threads)
        self._rng.shuffle(replies)
        return replies


def run_in_process(run_config: dict[str, Any], num_nodes: int, results_dir: Path, run_name: str,
                   callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Run the ServerApp's main on an :class:`InProcessGrid` (with round `callbacks` of the caller's); return the
    run's metrics.json.

    The file gains ``engine`` and, where CUDA is available, the GPU's name (``cuda_device`` in its last ``machines``
    entry), so that its wall times are not read as the Simulation Engine's (docs/methods.md).
    """
    import torch

    from hetfl.server_app import main

    run_config = {**run_config, "results-dir": str(results_dir), "run-name": run_name}
    grid = InProcessGrid(run_config, num_nodes, callbacks)
    with task_identity():
        main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    path = results_dir / run_name / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["engine"] = f"in-process ({num_nodes} nodes in one process, one after another; hetfl.inprocess)"
    if torch.cuda.is_available():
        for machine in metrics.get("machines", [])[-1:]:
            machine["cuda_device"] = torch.cuda.get_device_name()
    path.write_text(metrics_text(metrics))
    return metrics


RUN_CONTROL = frozenset({"results-dir", "run-name", "checkpoint", "resume", "stop-after-round"})
"""Run-config keys that say where and how a run is kept, not what it computes. :func:`same_config` also skips the
keys that start a run from a saved phase 1 (:func:`hetfl.methods.reuse_keys`): such a run equals the one that trains
it, row for row (the saved ensemble must record the same phase-1 settings; tests/test_oneshot.py)."""


def finished_run(run_dir: Path, run_config: dict[str, Any]) -> dict[str, Any] | None:
    """The metrics of the run in `run_dir` if it completed all its rounds with `run_config` (every key it sets, as
    validated, apart from :data:`RUN_CONTROL`), else None. A run there of another config is moved aside to
    ``<run_dir>.replaced-<k>`` (kept, never resumed under the new config); a run of this config that stopped early
    is left where it is, to resume."""
    from hetfl.methods import validate

    path = run_dir / "metrics.json"
    if not path.exists():
        return None
    metrics = json.loads(path.read_text())
    want = validate(run_config)
    if not same_config(metrics, run_config, want=want):
        k = 0
        while run_dir.with_name(f"{run_dir.name}.replaced-{k}").exists():
            k += 1
        run_dir.rename(run_dir.with_name(f"{run_dir.name}.replaced-{k}"))
        return None
    return metrics if metrics["summary"].get("rounds_completed") == want["num-server-rounds"] else None


def stored_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config as a metrics.json stores it (paths under the checkout relative to it) with those paths made absolute
    again (``dataset = "dir:..."``, ``server-data-path``, ``fleet``), so that it validates from any working
    directory."""
    from hetfl.common.results import REPO
    from hetfl.launch import absolute_paths

    return {**cfg, **absolute_paths(cfg, REPO)}


def same_config(metrics: dict[str, Any], run_config: dict[str, Any], every_key: bool = False,
                want: dict[str, Any] | None = None) -> bool:
    """Whether the run of `metrics` (a metrics.json) ran with every key `run_config` sets, as validated, apart from
    :data:`RUN_CONTROL`; with `every_key`, every key of either config (the stored one validated too, its defaults
    filled), so a key the run set and `run_config` leaves to its default counts as well. `want`: `run_config`
    validated already."""
    from hetfl.methods import reuse_keys, validate

    from hetfl.common.results import relative_paths

    skip = RUN_CONTROL | reuse_keys()
    want = validate(run_config) if want is None else want
    have = validate(stored_config(metrics.get("config", {}))) if every_key else metrics.get("config", {})
    keys = set(want) | set(have) if every_key else set(run_config)
    # a path under this checkout reads the same as the relative path a committed file holds
    return all(relative_paths(want.get(k)) == relative_paths(have.get(k)) for k in keys if k not in skip)
