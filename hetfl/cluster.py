"""A real Deployment Engine cluster on this machine: one SuperLink and N SuperNodes as separate processes.

The same topology as ``docker/compose.yml``, over loopback TCP. Each SuperNode declares its
data partition and device profile in its node config, which the apps read exactly as in
simulation (``partition-id``, ``num-partitions``, ``device-class`` for SHEFL, ``capacity``
for AdaptiveFL):

    python -m hetfl.cluster --nodes 4                 # start, print how to submit, Ctrl-C stops all
    flwr run . hetfl-local --run-config configs/quickstart.toml --stream   # from another shell

    python -m hetfl.cluster --nodes 4 --submit configs/quickstart-adaptivefl.toml --set num-server-rounds=2
                                                      # start, run one app to the end, stop

``--tls`` serves the SuperLink over TLS with certificates from ``docker/certs/generate.sh``;
``--auth`` also enables SuperNode authentication (each node signs with its own key pair, the
SuperLink only admits registered public keys). Everything started is stopped by PID (whole
process trees) on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetfl import launch

ROOT = launch.ROOT
TIERS = ("weak", "medium", "strong")


def node_profile(i: int, n: int, hpc_fraction: float = 0.5, proportions: tuple[int, int, int] = (4, 3, 3)) -> dict[str, Any]:
    """Node config of SuperNode i of n: its partition, SHEFL device class, AdaptiveFL capacity tier."""
    n_hpc = round(n * hpc_fraction)
    tot = sum(proportions)
    bounds = [round(n * sum(proportions[: k + 1]) / tot) for k in range(3)]
    tier = next(t for t, b in zip(TIERS, bounds, strict=True) if i < b)
    return {"partition-id": i, "num-partitions": n, "device-class": "hpc" if i < n_hpc else "lpc", "capacity": tier}


def node_config_arg(cfg: dict[str, Any]) -> str:
    """--node-config value: space-separated key=value, strings quoted."""
    return " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}" for k, v in cfg.items())


@dataclass
class Cluster:
    """A running SuperLink and its SuperNodes."""

    link: launch.SuperLink
    nodes: dict[int, subprocess.Popen] = field(default_factory=dict)  # partition id -> SuperNode process
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)
    tls: bool = False
    commands: dict[int, tuple[list[str], dict[str, str], Path]] = field(default_factory=dict)  # argv, env, log

    def start_node(self, i: int, cmd: list[str], env: dict[str, str], log_file: Path) -> None:
        """Start SuperNode `i` (its own process session, so that stopping it stops its ClientApps)."""
        self.commands[i] = (cmd, env, log_file)
        with open(log_file, "ab") as out:
            self.nodes[i] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def restart_node(self, i: int) -> None:
        """Kill SuperNode `i` and start it again with the same node config (same client ids, new node id)."""
        self.kill_node(i)
        self.start_node(i, *self.commands[i])

    def kill_node(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Kill SuperNode `pid` and its ClientApp processes (fault-injection)."""
        proc = self.nodes[pid]
        for p in launch.process_tree({proc.pid}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)

    def stop(self) -> None:
        """Stop every SuperNode (whole process trees), then the SuperLink."""
        roots = {p.pid for p in self.nodes.values()}
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in launch.process_tree(roots):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, sig)
            deadline = time.monotonic() + 10
            while launch.process_tree(roots) and time.monotonic() < deadline:
                for proc in self.nodes.values():
                    proc.poll()
                time.sleep(0.2)
        self.link.stop()

    def pids(self) -> list[int]:
        """Every live process of the cluster (for leak checks)."""
        return launch.process_tree({self.link.proc.pid} | {p.pid for p in self.nodes.values()})


def _certs(home: Path) -> Path:
    """TLS material (CA, server cert for 127.0.0.1/localhost/superlink) made by docker/certs/generate.sh."""
    out = home / "certs"
    if not (out / "ca.crt").exists():
        subprocess.run(["bash", str(ROOT / "docker" / "certs" / "generate.sh"), str(out)], check=True, capture_output=True)
    return out


def _node_keys(home: Path, n: int) -> tuple[list[Path], Path]:
    """One ECDSA key pair per SuperNode and the public-key list the SuperLink admits."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    keys, pubs = [], []
    d = home / "keys"
    d.mkdir(exist_ok=True)
    for i in range(n):
        key = ec.generate_private_key(ec.SECP384R1())
        path = d / f"node-{i}.key"
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
        keys.append(path)
        pubs.append(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode())
    csv = d / "supernode-public-keys.csv"
    csv.write_text(",".join(pubs) + "\n")
    return keys, csv


@contextlib.contextmanager
def local_cluster(num_nodes: int, home: Path | None = None, tls: bool = False, auth: bool = False,
                  configs: list[dict[str, Any]] | None = None, wait: bool = True) -> Iterator[Cluster]:
    """Start a SuperLink (deployment, not simulation) and `num_nodes` SuperNodes; stop them all on exit."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="hetfl-cluster-")) if home is None else home
    home.mkdir(parents=True, exist_ok=True)
    configs = configs or [node_profile(i, num_nodes) for i in range(num_nodes)]
    link_args: list[str] = []
    node_tls: list[str] = ["--insecure"]
    if tls or auth:
        certs = _certs(home)
        link_args = ["--ssl-ca-certfile", str(certs / "ca.crt"), "--ssl-certfile", str(certs / "server.pem"),
                     "--ssl-keyfile", str(certs / "server.key")]
        node_tls = ["--root-certificates", str(certs / "ca.crt")]
    keys: list[Path] = []
    if auth:
        keys, csv = _node_keys(home, num_nodes)
        link_args += ["--enable-supernode-auth"]
    with launch.superlink(home, simulation=False, extra_args=link_args, tls=bool(link_args)) as link:
        cluster = Cluster(link, tls=bool(link_args))
        if auth:
            for i in range(num_nodes):  # register each node's public key with the SuperLink
                pub = keys[i].with_suffix(".pub")
                pub.write_text(csv.read_text().strip().split(",")[i] + "\n")
                subprocess.run([launch._bin("flwr"), "supernode", "register", str(pub), link.connection],
                               env=launch.flwr_env(home), cwd=ROOT, check=True, capture_output=True)
        try:
            for i, cfg in enumerate(configs):
                cmd = [launch._bin("flower-supernode"), *node_tls, "--superlink", link.address,
                       "--node-config", node_config_arg(cfg), "--port", str(launch.free_port()), "--max-retries", "50"]
                if auth:
                    cmd += ["--auth-supernode-private-key", str(keys[i])]
                cluster.start_node(i, cmd, launch.flwr_env(home), home / f"supernode-{i}.log")
                cluster.configs[i] = cfg
            time.sleep(1.0)
            dead = [i for i, p in cluster.nodes.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"SuperNodes {dead} exited at start; see {home}/supernode-<i>.log")
            yield cluster
        finally:
            cluster.stop()


def submit(cluster: Cluster, config_file: str | None, overrides: dict[str, Any], results_dir: str | Path = "results",
           timeout: float | None = None) -> Path:
    """Submit one run with `flwr run . <connection>` and return its results directory (raises on failure)."""
    overrides = dict(overrides)
    overrides.setdefault("run-name", f"deploy-{Path(config_file).stem if config_file else 'run'}-{time.strftime('%Y%m%d-%H%M%S')}")
    overrides["results-dir"] = str(Path(results_dir).resolve())
    overrides.setdefault("min-available-nodes", len(cluster.nodes))
    launch.preflight({**launch.load_preset(config_file), **overrides}, len(cluster.nodes))
    rc = launch.flwr_run(cluster.link, ROOT, config_file, overrides, None, timeout=timeout)
    run_dir = Path(results_dir).resolve() / overrides["run-name"]
    if rc != 0 or not (run_dir / "metrics.json").exists():
        raise RuntimeError(f"run failed (flwr exit {rc}); no {run_dir / 'metrics.json'}")
    return run_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--home", default=str(ROOT / ".flwr" / "cluster"), help="FLWR_HOME of the cluster (logs, state, certs)")
    p.add_argument("--tls", action="store_true", help="TLS between SuperNodes/CLI and the SuperLink")
    p.add_argument("--auth", action="store_true", help="TLS + SuperNode authentication")
    p.add_argument("--submit", metavar="PRESET", help="run this preset to the end, then stop the cluster")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--debug", action="store_true", help="show tracebacks of configuration errors")
    a = p.parse_args(argv)
    launch.setup_signals()
    if a.submit:  # check the run before any SuperLink or SuperNode starts
        try:
            with launch.config_errors(a.debug):
                launch.preflight({**launch.load_preset(a.submit), "min-available-nodes": a.nodes, **launch.parse_set(a.set)},
                                 a.nodes)
        except SystemExit as err:
            return int(err.code or 0)
    with local_cluster(a.nodes, Path(a.home), tls=a.tls, auth=a.auth) as cluster:
        print(f"SuperLink {cluster.link.address} (FLWR_HOME={a.home}, connection '{cluster.link.connection}'), "
              f"{len(cluster.nodes)} SuperNodes:")
        for i, cfg in cluster.configs.items():
            print(f"  supernode {i}: pid {cluster.nodes[i].pid}  node-config {node_config_arg(cfg)}")
        if a.submit:
            run_dir = submit(cluster, a.submit, launch.parse_set(a.set))
            s = json.loads((run_dir / "metrics.json").read_text())["summary"]
            print(f"final accuracy {100 * s['final_accuracy']:.2f}%; results: {run_dir}")
            return 0
        print(f"\nSubmit runs from another shell:\n  FLWR_HOME={a.home} FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 "
              f".venv/bin/flwr run . {cluster.link.connection} --stream --run-config configs/quickstart.toml\n"
              f"(min-available-nodes must be <= {a.nodes}). Ctrl-C stops the cluster.")
        try:
            while all(p.poll() is None for p in cluster.nodes.values()):
                time.sleep(1.0)
            print("a SuperNode exited; stopping the cluster")
        except KeyboardInterrupt:
            print("stopping the cluster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
