"""Shared fixtures: a private partition cache and a Flower task identity for building Messages."""

from __future__ import annotations

import json
import logging
import os
import resource
import threading
import time
from pathlib import Path

import pytest

# OpenMP threads that wait by sleeping, not spinning: two pytest workers (and the processes they start) each run torch
# with as many threads as there are CPUs, and a spinning waiter then holds a core the other worker needs. Measured
# (docs/results/README.md#test-suite-time): 2-7x slower small-model tests under `-n 2`, none alone. Set before torch
# loads (the OpenMP runtime reads it once); inherited by every process a test starts; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

# HETFL_TEST_TIMELINE=<file>: each test appends "worker start end cpu nodeid" there (wall clock, and the CPU seconds
# of the worker and of the processes it started and reaped), to see how the workers shared the suite and which tests
# use the cores rather than wait (docs/results/README.md#test-suite-time; scripts/test_timeline.py reads it). Under
# xdist only the workers write: the controller sees the same tests relayed.
_TIMELINE = os.environ.get("HETFL_TEST_TIMELINE")
_STARTED: dict[str, tuple[float, float]] = {}


def _cpu_seconds() -> float:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


# Where cgroup v1's cpuacct hierarchy is writable (root), a timeline test runs with its worker in a cpuacct cgroup of
# its own, so that every process it starts, reaped or not (Ray's daemons, SuperExec's ClientApps), counts to it; the
# cgroup is removed after the test (a process left running keeps it, and the timeline line says "leaked").
_CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _cgroup_enter(nodeid: str) -> Path | None:
    if not os.access(_CPUACCT / "cgroup.procs", os.W_OK):
        return None
    group = _CPUACCT / f"hetfl-test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{len(_STARTED)}-{time.time_ns()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return None
    return group


def _cgroup_leave(group: Path) -> tuple[float, bool]:
    """(CPU seconds of everything that ran in `group`, whether a process is still in it); the worker back at the root."""
    (_CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
    cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    leaked = bool((group / "cgroup.procs").read_text().split())
    if not leaked:
        group.rmdir()
    return cpu, leaked


def pytest_configure(config):
    global _TIMELINE
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        _TIMELINE = None  # the xdist controller


def pytest_sessionfinish(session, exitstatus):
    """The cpuacct cgroups a leaked process kept: its processes back at the root, the cgroup removed."""
    if not _TIMELINE or not os.access(_CPUACCT / "cgroup.procs", os.W_OK):
        return
    for group in _CPUACCT.glob(f"hetfl-test-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-*"):
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (_CPUACCT / "cgroup.procs").write_text(pid)
            except OSError:  # it ended meanwhile
                pass
        try:
            group.rmdir()
        except OSError:
            pass


def pytest_runtest_logstart(nodeid, location):
    if _TIMELINE:
        _STARTED[nodeid] = (time.time(), _cpu_seconds(), _cgroup_enter(nodeid))


def pytest_runtest_logfinish(nodeid, location):
    if _TIMELINE and nodeid in _STARTED:
        start, cpu, group = _STARTED.pop(nodeid)
        used, leaked = _cgroup_leave(group) if group else (_cpu_seconds() - cpu, False)
        with open(_TIMELINE, "a") as f:
            f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {start:.2f} {time.time():.2f} "
                    f"{used:.2f} {nodeid}{' leaked' if leaked else ''}\n")


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Keep partition caches of the test run out of ~/.cache."""
    os.environ["HETFL_CACHE"] = str(tmp_path_factory.mktemp("hetfl-cache"))
    yield


@pytest.fixture
def task_identity():
    """Flower 1.41 Messages need a run/node identity in the creating process."""
    from hetfl.inprocess import task_identity as identity

    with identity():
        yield


def after_round(metrics: Path, action, limit: float = 900.0, rounds: int = 1) -> tuple[threading.Thread, dict]:
    """Run `action` in a thread as soon as `metrics` (a run's metrics.json) holds round `rounds` (default 1); the dict
    gets "at". The deployment tests' way to act in the middle of a run (kill or restart a process, cut a link)."""
    done: dict = {}

    def watch():
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if metrics.exists() and len(json.loads(metrics.read_text())["rounds"]) >= rounds + 1:
                action()
                done["at"] = time.monotonic()
                return
            time.sleep(0.2)

    t = threading.Thread(target=watch)
    t.start()
    return t, done


def require_fmnist() -> None:
    """FMNIST tests need the Debian package; `make test` installs it (fail loudly, never skip)."""
    if not (FMNIST_DIR / "train-images-idx3-ubyte.gz").exists():
        pytest.fail("Fashion-MNIST missing: apt-get install -y dataset-fashion-mnist (make data)")


TOPICS = {
    0: ["government", "election", "minister", "parliament", "treaty", "president"],
    1: ["match", "goal", "team", "season", "coach", "tournament"],
    2: ["stocks", "market", "profit", "shares", "investors", "earnings"],
    3: ["software", "chip", "internet", "computer", "startup", "device"],
}


def write_synthetic_ag_news(root, n_train=400, n_test=80, seed=0):
    """A small AG-News-format corpus (class index 1-4, title, description) with topic words per class."""
    import csv

    import numpy as np

    rng = np.random.default_rng(seed)
    d = root / "ag_news"
    d.mkdir(parents=True, exist_ok=True)
    filler = ["the", "a", "new", "report", "says", "after", "today", "week", "big", "plan"]
    for name, n in (("train.csv", n_train), ("test.csv", n_test)):
        with open(d / name, "w", newline="") as f:
            w = csv.writer(f)
            for i in range(n):
                c = int(i % 4)
                words = list(rng.choice(TOPICS[c], 3)) + list(rng.choice(filler, 5))
                rng.shuffle(words)
                w.writerow([c + 1, " ".join(words[:4]).title(), " ".join(words[4:]) + "."])
    return root


def identity_map(clients):
    """A ClientMap in which client c is served by node c + 1000 (tests of strategies without a grid)."""
    from hetfl.common.nodes import ClientMap

    return ClientMap({int(c) + 1000: {"client-ids": [int(c)]} for c in clients})


class LoopbackGrid:
    """A grid whose nodes answer each message with `answer(msg) -> Message`; gives messages ids as Flower's grids do."""

    def __init__(self, nodes, answer):
        self.nodes, self.answer = list(nodes), answer

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        import uuid

        out = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            out.append(self.answer(m))
        return out


def replies_to(cmap, contents, message_type="train"):
    """Replies with the given contents ({client id: RecordDict}), as if each client had been sent a message through
    `cmap` (so that ``cmap.client_of`` names them, as after a round's send)."""
    from flwr.app import ConfigRecord, Message, RecordDict

    msgs = [cmap.message(c, RecordDict({"config": ConfigRecord({})}), message_type) for c in contents]
    grid = LoopbackGrid(cmap.hosted, lambda m: Message(contents[int(m.content["client"]["client-id"])], reply_to=m))
    return cmap.send_and_receive(grid, msgs, timeout=5)


class Lines(logging.Handler):
    """Collects the 'hetfl' logger's lines (it does not propagate to pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def hetfl_lines():
    """The hetfl logger's INFO lines while the test runs (progress lines, heartbeats, warnings)."""
    log = logging.getLogger("hetfl")
    handler, level = Lines(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
