"""A SuperExec for SuperNodes that starts each ClientApp warm: forked from a process that has PyTorch loaded.

Flower 1.41's SuperNode runs a ClientApp in a fresh process per message, started by its SuperExec (``flower-superexec``,
``flwr-clientapp``). For a PyTorch app most of that process's cost is imports the app did not choose: Flower, PyTorch,
and ``torch._dynamo``, which an optimizer's first step and ``FlopCounterMode`` import (docs/deployment.md#round-cost).
This SuperExec pays them once: it imports them, then serves the SuperNode's tasks as Flower's does, except that each
ClientApp task runs in a child forked from it (Flower's own ``run_clientapp``, so the same pulls, heartbeats, FAB
install, exit codes and reply) instead of a new interpreter. Other task types go to Flower's subprocess executor.

The app's own package is never taken from this process: the child drops every ``hetfl`` module before the ClientApp
loads, so the code that runs is the submitted app's (its FAB), as with Flower's executor. A SuperNode uses it with
Flower's process isolation::

    flower-supernode --superlink HOST:9092 --isolation process --port 9094 ... &
    python -m hetfl.superexec --runtime-api-address 127.0.0.1:9094 --insecure --parent-pid $!

(``hetfl.cluster`` starts both for every SuperNode it runs.) Its flags are ``flower-superexec``'s.

Several SuperNodes on one machine (``hetfl.cluster``'s local role) share one :class:`Pool`: a process that pays the
imports once and forks each node's SuperExec from them (``python -m hetfl.superexec --pool``), instead of one warm-up
per node.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# asked for a task this often (Flower's SuperExec: 1 s; the SuperNode itself polls its SuperLink every 3 s; 0.2 s
# cost 0.025 of a core per idle node here)
POLL_S = "0.5"


def warm_up() -> None:
    """Import what every ClientApp process of this app would import, once (the forked children share it)."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401  (an optimizer's first step and FlopCounterMode import it)
    import torch.utils.flop_counter  # noqa: F401
    import flwr.clientapp  # noqa: F401
    import flwr.supernode.runtime.run_clientapp  # noqa: F401


def _forget_app_modules() -> None:
    """Drop the ``hetfl`` modules this process imported, so the child imports the submitted app's own."""
    for name in [m for m in sys.modules if m == "hetfl" or m.startswith("hetfl.")]:
        del sys.modules[name]


class WarmExecutor:
    """Flower's SuperExec executor (``flwr.supercore.superexec.executor.types.Executor``) that forks ClientApps."""

    def __init__(self) -> None:
        from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor

        self.other = SubprocessExecutor()  # any task type but a ClientApp
        self.children: set[int] = set()

    def get_eligible_capacity(self, supported_task_types: set, **kw: Any) -> tuple[set, set[str]]:
        return self.other.get_eligible_capacity(supported_task_types, **kw)

    def wait_for_capacity(self, task_type: Any = None, **kw: Any) -> None:
        self.other.wait_for_capacity(task_type, **kw)

    def launch(self, spec: Any) -> Any:
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor.types import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP:
            return self.other.launch(spec)
        pid = os.fork()
        if pid == 0:  # the child never returns
            _run_client_app(spec)
        self.children.add(pid)
        print(f"hetfl.superexec: task {spec.task_id}: ClientApp in warm process {pid}", flush=True)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished children (called by Flower's SuperExec loop before each poll)."""
        for pid in list(self.children):
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                self.children.discard(pid)

    def close(self) -> None:
        self.other.close()


def _exit_with(body: Callable[[], None]) -> None:
    """In a forked child: run `body`, then exit with its code (Flower's ``flwr_exit`` raises SystemExit), never
    returning into the parent's loop."""
    code = 1
    try:
        body()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_client_app(spec: Any) -> None:
    """In the forked child: Flower's ``flwr-clientapp`` for `spec`'s token, then exit with its code."""

    def body() -> None:
        from flwr.supercore.exit import exit_handler
        from flwr.supercore.tls import validate_and_resolve_root_certificates
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        exit_handler.registered_exit_handlers.clear()  # the parent's (its Runtime API client, this executor)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        _forget_app_modules()
        run_clientapp(runtime_api_address=spec.runtime_api_address, token=spec.token, insecure=spec.insecure,
                      certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
                      parent_pid=spec.parent_pid, runtime_dependency_install=spec.runtime_dependency_install)

    _exit_with(body)


class Pool:
    """The SuperExecs of several SuperNodes on one machine, forked from one warm process (``--pool``).

    The pool reads one request per line on its stdin (JSON: the SuperExec's flags and its log file) and answers
    with the pid of the SuperExec it forked for it (in a process session of its own, logging to that file); it
    exits when its stdin closes. A pipe, not a socket: only the process that started the pool can ask it for a
    SuperExec. Each SuperExec exits with its SuperNode (``--parent-pid``), as a stand-alone one does.
    """

    def __init__(self, env: dict[str, str] | None = None, log_file: Path | None = None) -> None:
        import subprocess
        import threading

        out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115  (the pool's own log)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "hetfl.superexec", "--pool"], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=out,
                                         start_new_session=True)
        finally:
            if log_file:
                out.close()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the pipes (the pool exits at the end of its stdin, if it still runs)."""
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()

    def start(self, argv: list[str], log_file: Path) -> ForkedProcess:
        """A SuperExec with `argv` (``flower-superexec``'s flags), forked from the pool once it is warm."""
        import json

        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write((json.dumps({"argv": argv, "log": str(log_file)}) + "\n").encode())
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"the SuperExec pool (pid {self.proc.pid}) did not start a SuperExec: {line!r}")
        return ForkedProcess(int(line))


class ForkedProcess:
    """A process forked by a :class:`Pool` (its parent reaps it): the part of ``subprocess.Popen`` that
    ``hetfl.cluster`` uses (``pid``, ``poll``, ``wait``). Its exit code is not known here: ``poll`` gives -1 once
    it is gone. Gone means gone for good: its pid, once free, may be another process's (psutil compares start
    times)."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.pid = pid
        self.returncode: int | None = None
        try:
            self._proc: Any = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self._proc, self.returncode = None, -1

    def poll(self) -> int | None:
        import psutil

        if self.returncode is None:
            try:
                gone = not self._proc.is_running() or self._proc.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.1)
        return -1


def _serve_pool() -> None:
    """The pool's side of :class:`Pool`: warm up, then fork one SuperExec per request line until stdin closes."""
    import json

    sys.stdout.flush()
    reply = os.fdopen(os.dup(1), "wb", buffering=0)  # the answers' own channel: nothing printed can get into it
    os.dup2(2, 1)  # whatever the imports or Flower print goes to the pool's log
    warm_up()
    # reap each SuperExec as it exits (a wait, not SIG_IGN: so that its CPU time counts as this process's children's,
    # and so, once the pool is reaped, as its starter's, as with a SuperExec started as a process of its own)
    signal.signal(signal.SIGCHLD, _reap)
    for line in sys.stdin.buffer:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            reply.close()
            _run_superexec(req["argv"], req["log"])
        reply.write(f"{pid}\n".encode())


def _reap(*_: Any) -> None:
    """Reap every child of the pool that has exited (SIGCHLD handler)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _run_superexec(argv: list[str], log_file: str) -> None:
    """In a child of the pool: a SuperExec of its own session, its output in `log_file`; exit with its code."""

    def body() -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # it waits for its own ClientApps
        os.setsid()
        fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        for src, dst in ((null, 0), (fd, 1), (fd, 2)):
            os.dup2(src, dst)
        os.close(fd)
        os.close(null)
        main(argv)

    _exit_with(body)


def main(argv: list[str] | None = None) -> None:
    """``flower-superexec`` with :class:`WarmExecutor` (same flags; the executor flags are ignored)."""
    import importlib

    rs = importlib.import_module("flwr.supercore.superexec.run_superexec")
    cli = importlib.import_module("flwr.supercore.cli.flower_superexec")  # the module (its package exports the function)

    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", POLL_S)
    warm_up()
    rs.get_executor = lambda *a, **k: WarmExecutor()  # Flower's loop, this executor
    sys.argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    cli.flower_superexec()


if __name__ == "__main__":
    if sys.argv[1:] == ["--pool"]:
        _serve_pool()
    else:
        main()
