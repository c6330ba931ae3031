"""docs/deployment.md "Deploy on real devices", run as written: a server, three devices and a laptop on a private network.

Each host is a Linux network namespace with one address on a bridge (10.77.0.0/24; the bridge sits in a namespace
of its own, and no host has a route anywhere else), its own home directory (``~/.flwr``, keys, ``ca.crt``) and its
own copy of the project. The test runs every command of that section's code blocks in its host, in order,
copies the files the walk-through says to copy, and meanwhile submits SHEFL, FENS and AdaptiveFL (small quickstart
presets, 1 round each) from the laptop next to the walk-through's FedAvg run (2 rounds), so all four methods share the one cluster,
with TLS and SuperNode authentication on. Each must end ``finished:completed`` with a metrics.json of its rounds.
Then everything is stopped the walk-through's way (SIGTERM) and the test checks that no process is left in any
namespace before it deletes them (also on failure). Skipped, with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hetfl import launch

from .conftest import require_fmnist
from .netns import network, ns_pids, require_namespaces, routes

ROOT = launch.ROOT
SECTION = "## Deploy on real devices"
NET = "10.77.0"
HOSTS = {"server": f"{NET}.1", "laptop": f"{NET}.2", **{f"device-{i}": f"{NET}.{10 + i}" for i in range(3)}}
DEVICES = [h for h in HOSTS if h.startswith("device-")]
LONG_RUNNING = ("python -m hetfl.cluster superlink", "python -m hetfl.cluster supernode", "flower-supernode ")

# Each device holds only its own data: the walk-through exports the split on the server (python -m hetfl.export), the test
# copies client-<i> to device i as ~/data (the walk-through's scp), and the devices' processes see an empty
# /usr/share/datasets (a tmpfs in their mount namespace): no global dataset file is reachable from them.
HIDDEN = "/usr/share/datasets"

COMMON = {"num-server-rounds": 1, "min-available-nodes": 3, "max-test-samples": 500}
RUNS = {  # next to the walk-through's FedAvg run (run-name fedavg-3-devices): preset, overrides
    "shefl": ("configs/quickstart.toml", {"method": "shefl", "fraction-train": 1.0, "local-steps": 5,
                                          "shefl-models": 2, "shefl-hpc-per-round": 1}),
    "fens": ("configs/quickstart-fens.toml", {"local-epochs": 0, "local-steps": 5, "fens-agg-local-steps": 2}),
    "adaptivefl": ("configs/quickstart-adaptivefl.toml", {"fraction-train": 1.0, "local-steps": 5}),
}


def write_runs(hosts: Hosts) -> dict[str, str]:
    """The RUNS' run-config files, written into the laptop's project before the walk-through's `flwr run`, so that
    all four runs send one app bundle (Flower names a bundle by the hash of the project's files)."""
    return {name: launch.write_run_config(hosts.project("laptop") / f"run-{name}.toml", preset,
                                          {**COMMON, **over, "run-name": name}).name
            for name, (preset, over) in RUNS.items()}


def submit_after(hosts: Hosts, extra: dict[str, subprocess.Popen], first: str, configs: dict[str, str],
                 limit: float = 600.0) -> None:
    """Submit the RUNS from the laptop, together, once the run `first` has written its round-0 row on the server,
    i.e. its ServerApp is up and every device answered discovery.

    Flower 1.41 installs a run's app bundle into ``<flwr home>/apps/<hash>`` without a lock (mkdir, then copy file by
    file; ``flwr.cli.install.validate_and_install``), and a second run of the same bundle that finds the directory
    already there uses it as it is: started together, a run can fail with "Cannot find pyproject.toml" while the
    first still copies (seen once in this test on a loaded machine). Once one run of the bundle is up, the others
    (the same bundle: :func:`write_runs`) are safe; the runs train side by side."""
    previous = hosts.project("server") / "results" / first / "metrics.json"
    deadline = time.monotonic() + limit
    while not previous.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    for name, run_config in configs.items():
        extra[name] = hosts.start("laptop", f"flwr run . hetfl-remote --stream --run-config {run_config}")


def readme_blocks() -> list[tuple[list[str], list[str]]]:
    """(hosts, commands) of each bash block of the section, in order.

    A block's first line says where it runs (``# on the server``, ``# on the laptop``, ``# on each device``,
    ``# on device N``); a command is a line with its ``\\`` continuations or its here-document.
    """
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text[text.index(SECTION):]
    section = section[: section.index("\n## ", 1)]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        first, *lines = block.splitlines()
        where = first.removeprefix("# on ").strip()
        hosts = {"the server": ["server"], "the laptop": ["laptop"], "each device": DEVICES}.get(where) or \
            [f"device-{where.removeprefix('device ')}"]
        assert set(hosts) <= set(HOSTS), first
        commands: list[str] = []
        it = iter(lines)
        for line in it:
            cmd = line
            while cmd.endswith("\\"):
                cmd = cmd[:-1] + next(it).strip()
            if m := re.search(r"<<'?(\w+)'?", cmd):  # here-document: through its end marker
                body = []
                for doc in it:
                    body.append(doc)
                    if doc == m.group(1):
                        break
                cmd = "\n".join([cmd, *body])
            commands.append(cmd)
        out.append((hosts, commands))
    return out


class Hosts:
    """The hosts' homes, environments and the processes started in their namespaces."""

    def __init__(self, tmp: Path, namespaces: dict[str, str]) -> None:
        self.tmp, self.ns = tmp, namespaces
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.logs: dict[int, Path] = {}
        self.timeline: list[tuple[float, str, str]] = []  # (seconds, host, command) of each command run to its end
        for host in HOSTS:  # each host: its own home, holding its copy of the project
            launch.stage_app(ROOT, self.project(host))

    def home(self, host: str) -> Path:
        return self.tmp / host

    def project(self, host: str) -> Path:
        return self.home(host) / "hetfl"

    def env(self, host: str) -> dict[str, str]:
        """The project's environment active, the host's own home; nothing of this test process's Flower state."""
        env = {k: v for k, v in os.environ.items() if k not in ("FLWR_HOME", "PYTHONPATH", "HETFL_CACHE")}
        env.update(HOME=str(self.home(host)), PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]),
                   FLWR_DISABLE_UPDATE_CHECK="1", HF_HUB_OFFLINE="1")
        return env

    def _argv(self, host: str, command: str) -> list[str]:
        if host in DEVICES:  # `ip netns exec` gives each command a mount namespace of its own: the mount stays there
            command = f"mount -t tmpfs -o ro,size=1m none {HIDDEN}; {command}"
        return ["ip", "netns", "exec", self.ns[host], "bash", "-euo", "pipefail", "-c", command]

    def start(self, host: str, command: str) -> subprocess.Popen:
        """`command` in the background (exec'd: the PID is the command's), output to a log in the host's home."""
        log = self.home(host) / f"proc-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(self._argv(host, f"exec {command}"), cwd=self.project(host), env=self.env(host),
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((host, proc))
        self.logs[proc.pid] = log
        return proc

    def run(self, host: str, command: str, timeout: float = 300) -> str:
        """`command` to its end; its output (fails the test on a non-zero exit)."""
        t0 = time.monotonic()
        r = subprocess.run(self._argv(host, command), cwd=self.project(host), env=self.env(host), capture_output=True,
                           text=True, timeout=timeout)
        self.timeline.append((time.monotonic() - t0, host, command.splitlines()[0][:70]))
        assert r.returncode == 0, f"{host}: {command}\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
        return r.stdout

    def output(self, proc: subprocess.Popen) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def wait_for(self, proc: subprocess.Popen, text: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output(proc):
            assert proc.poll() is None, f"exited with {proc.returncode}:\n{self.output(proc)[-4000:]}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{self.output(proc)[-4000:]}"
            time.sleep(0.3)

    def copy_files(self) -> None:
        """The copies the walk-through asks for: the server's CA to every host, each device's public key to the laptop."""
        ca = self.project("server") / ".flwr" / "superlink" / "certs" / "ca.crt"
        if ca.exists():
            for host in HOSTS:
                if host != "server" and not (self.home(host) / "ca.crt").exists():
                    shutil.copy(ca, self.home(host) / "ca.crt")
        for i, dev in enumerate(DEVICES):
            pub = self.home(dev) / "supernode.key.pub"
            if pub.exists():
                shutil.copy(pub, self.home("laptop") / f"{dev}.pub")
            data = self.project("server") / "export" / f"client-{i}"
            if data.exists() and not (self.home(dev) / "data").exists():
                shutil.copytree(data, self.home(dev) / "data")


@pytest.mark.hosts
@pytest.mark.slow
def test_readme_deployment_on_separate_hosts_runs_every_method(tmp_path):
    require_namespaces()
    require_fmnist()
    t0 = time.monotonic()
    blocks = readme_blocks()
    assert [h for h, _ in blocks][0] == ["server"] and any("flwr run" in c for _, cs in blocks for c in cs)
    with network(f"hfl{os.getpid()}", HOSTS) as namespaces:
        hosts = Hosts(tmp_path, namespaces)
        configs = write_runs(hosts)
        t_staged = time.monotonic() - t0
        try:
            for ns in namespaces.values():  # traffic only among the hosts: their /24, no default route
                table = routes(ns)
                assert table and all(r.startswith(f"{NET}.0/24 dev eth0 ") for r in table), table
            for dev in DEVICES:  # the global dataset is out of the devices' reach
                assert hosts.run(dev, f"ls -A {HIDDEN} | wc -l").strip() == "0", dev
            extra: dict[str, subprocess.Popen] = {}
            submitter = None
            server = None
            for block_hosts, commands in blocks:
                if "laptop" in block_hosts and any(c.startswith("flwr run") for c in commands):
                    # the other methods, next to the walk-through's run, submitted once it has recorded round 0
                    # (see submit_after)
                    submitter = threading.Thread(target=submit_after, args=(hosts, extra, "fedavg-3-devices", configs),
                                                 daemon=True)
                    submitter.start()
                for host in block_hosts:
                    for command in commands:
                        if command.startswith(LONG_RUNNING):
                            proc = hosts.start(host, command)
                            if host == "server":
                                server = proc
                                hosts.wait_for(proc, "SuperLink serving on")
                        else:
                            hosts.run(host, command, timeout=600)
                hosts.copy_files()
            assert server is not None and submitter is not None
            t_up = time.monotonic() - t0
            submitter.join(900)
            assert not submitter.is_alive() and sorted(extra) == sorted(RUNS), sorted(extra)
            for name, proc in extra.items():
                assert proc.wait(600) == 0, f"{name}:\n{hosts.output(proc)[-4000:]}"
            # every run completed, with a metrics.json of its rounds on the server
            t_runs = time.monotonic() - t0
            runs = json.loads(hosts.run("laptop", "flwr list hetfl-remote --format json"))
            statuses = sorted(r["status"] for r in runs["runs"])
            assert statuses == ["finished:completed"] * 4, runs
            results = hosts.project("server") / "results"
            for name, rounds in (("fedavg-3-devices", 2), *((name, COMMON["num-server-rounds"]) for name in RUNS)):
                m = json.loads((results / name / "metrics.json").read_text())
                assert m["summary"]["rounds_completed"] == rounds and len(m["rounds"]) == rounds + 1, (name, m["summary"])
                assert m["rounds"][-1]["failures"] == 0 and m["rounds"][-1]["bytes_up"] > 0, (name, m["rounds"][-1])
            # the devices' declared profiles, not the simulated draws (which give 2 HPCs + 1 LPC, and one weak device)
            shefl = json.loads((results / "shefl" / "metrics.json").read_text())
            assert (shefl["roles"]["hpc"], shefl["roles"]["lpc"]) == (1, 2), shefl["roles"]
            for r in json.loads((results / "adaptivefl" / "metrics.json").read_text())["rounds"][1:]:
                # device 1 (weak) trains an S model, device 2 (300,000 parameters) only S2, whatever was sent
                assert r["back_S1"] + r["back_S2"] >= 2 and r["back_S2"] >= 1, r
            # secured: the SuperLink serves TLS and admits only registered SuperNodes
            link_cmd = [open(f"/proc/{p}/cmdline").read().split("\0") for p in launch.process_tree({server.pid})
                        if "flower-superlink" in open(f"/proc/{p}/cmdline").read()]
            assert link_cmd and "--enable-supernode-auth" in link_cmd[0] and "--ssl-certfile" in link_cmd[0]
            assert "--insecure" not in link_cmd[0]
            # stopping, the walk-through's way: SIGTERM each SuperNode, then the SuperLink; nothing may be left
            for host, proc in hosts.procs:
                if host in DEVICES:
                    proc.terminate()
            for host, proc in hosts.procs:
                if host in DEVICES:
                    proc.wait(30)
            server.terminate()
            server.wait(30)
            deadline = time.monotonic() + 30
            while (left := {h: ns_pids(ns) for h, ns in namespaces.items() if ns_pids(ns)}) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not left, f"left running after SIGTERM: {left}"
        finally:
            launch.stop_tree([p for _, p in hosts.procs], timeout=10)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [ns for ns in namespaces.values() if ns in listed], listed
    assert launch.process_tree({p.pid for _, p in hosts.procs}) == []
    print(f"multi-host deployment: hosts staged at {t_staged:.0f} s, walk-through blocks done (FedAvg ran) at {t_up:.0f} s, all 4 runs at {t_runs:.0f} s, "
          f"stopped and cleaned up at {time.monotonic() - t0:.0f} s (load average {os.getloadavg()[0]:.1f}); slowest "
          "commands: " + "; ".join(f"{host} {cmd!r} {s:.0f} s" for s, host, cmd in sorted(hosts.timeline)[::-1][:6]))
