"""Flower's Deployment Engine with real processes: this machine, or a server and devices (docs/deployment.md).

Three roles, one module:

    python -m hetfl.cluster --nodes 4                 # local: a SuperLink and 4 SuperNodes here; Ctrl-C stops all
    python -m hetfl.cluster --nodes 4 --submit configs/quickstart-adaptivefl.toml --set num-server-rounds=2
                                                      # start, run one preset to the end, stop

    python -m hetfl.cluster superlink --address 10.0.0.5          # server: just the SuperLink, for other hosts
    python -m hetfl.cluster supernode --superlink 10.0.0.5:8000 --root-certificates ca.crt \\
        --auth-key supernode.key --node-config 'partition-id=0 num-partitions=3 device-class="hpc" capacity="weak"'
                                                      # device: one SuperNode of a remote SuperLink

Each SuperNode declares its client and device profile in its node config (``partition-id``,
``num-partitions``, SHEFL's ``device-class``, AdaptiveFL's ``capacity``; :mod:`hetfl.common.nodeconfig`),
checked before any process starts. On loopback, ``--tls`` serves the SuperLink over TLS and ``--auth`` adds
SuperNode authentication (each node signs with its own key, the SuperLink admits only registered public keys).
On any other ``--address`` both are on by default, with a server certificate issued for that address (and the
``--san`` names); ``--insecure`` (neither) and ``--no-auth`` (TLS only) turn them off with a warning.
Everything started is stopped by PID (whole process trees) on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetfl import launch

ROOT = launch.ROOT
DEFAULT_PORT = 8000  # flower-superlink's own default for its one HTTP port (Fleet, Control and Runtime APIs)
LOOPBACK_SANS = ("localhost", "127.0.0.1", "::1")  # the SuperLink's own SuperExec reaches a wildcard bind here


class ArgError(launch.PreflightError):
    """A bad command-line value of hetfl.cluster (one line: the flag, the value, what is allowed)."""


def tiers() -> tuple[str, ...]:
    """AdaptiveFL's device tiers, smallest first (the node-config key `capacity`)."""
    from hetfl.adaptivefl_app.keys import TIERS

    return TIERS


def node_profile(i: int, n: int, hpc_fraction: float = 0.5, proportions: tuple[int, int, int] = (4, 3, 3)) -> dict[str, Any]:
    """Node config of SuperNode i of n: its partition, SHEFL device class, AdaptiveFL capacity tier."""
    n_hpc = round(n * hpc_fraction)
    tot = sum(proportions)
    bounds = [round(n * sum(proportions[: k + 1]) / tot) for k in range(3)]
    tier = next(t for t, b in zip(tiers(), bounds, strict=True) if i < b)
    return {"partition-id": i, "num-partitions": n, "device-class": "hpc" if i < n_hpc else "lpc", "capacity": tier}


def node_config_arg(cfg: dict[str, Any]) -> str:
    """--node-config value: space-separated key=value, strings quoted."""
    return " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}" for k, v in cfg.items())


def check_node_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The node config checked against the schema, with its data (partition-id and num-partitions, or data-path):
    ArgError if not."""
    from hetfl.common.nodeconfig import NodeConfigError, NodeProfile
    from hetfl.methods import NODE_SCHEMA

    try:
        NODE_SCHEMA.validate(cfg)
    except NodeConfigError as err:
        raise ArgError(str(err)) from None
    profile = NodeProfile(cfg)
    if profile.own_data:  # data of its own: the client id is client-id, partition-id or from the data
        if not Path(profile.data_path).is_dir():
            raise ArgError(f"node config key 'data-path' = {profile.data_path!r}: no such directory on this machine; "
                           "expected a directory with this node's data (an image folder, or python -m hetfl.export's "
                           "output; docs/node-data.md)")
        return cfg
    for key in ("partition-id", "num-partitions"):
        if key not in cfg:
            raise ArgError(f"node config lacks {key!r}; every SuperNode declares its data: a partition of the run's "
                           f"dataset, e.g. --node-config 'partition-id=0 num-partitions=3', or a directory of its "
                           f"own, e.g. --node-config 'data-path=\"/data/client-0\"'")
    return cfg


# --- addresses, TLS and SuperNode authentication -------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    """Whether a server bound to `host` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::")


def check_host(flag: str, host: str) -> str:
    """An IP address or a host name, else ArgError."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return host
    if host and all(part and len(part) <= 63 and part.replace("-", "").isalnum() and not part.startswith("-")
                    for part in host.split(".")):
        return host
    raise ArgError(f"{flag} {host!r} is not allowed; expected an IP address (e.g. 10.0.0.5, 0.0.0.0) or a host name")


def check_superlink(value: str) -> str:
    """--superlink host:port ([ipv6]:port), else ArgError."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ArgError(f"--superlink {value!r} is not allowed; expected host:port, e.g. 10.0.0.5:{DEFAULT_PORT}")
    check_host("--superlink", host.strip("[]"))
    return value


def security(host: str, tls: bool, auth: bool, insecure: bool, no_auth: bool) -> tuple[bool, bool]:
    """(TLS, SuperNode auth) for a SuperLink on `host`: on by default off loopback, opt-in on loopback.

    Opting out off loopback prints a warning; contradictory flags raise ArgError.
    """
    if insecure and (tls or auth):
        raise ArgError("--insecure turns TLS and SuperNode authentication off; expected it without --tls/--auth")
    if no_auth and auth:
        raise ArgError("--no-auth and --auth contradict each other; expected one of them")
    if is_loopback(host):
        return (tls or auth) and not insecure, auth and not no_auth
    if insecure:
        warn(f"--insecure: the SuperLink on {host} takes plain-text connections from any host and any SuperNode "
             "(models, configs and runs unencrypted; anyone who reaches the port can join or submit)")
        return False, False
    if no_auth:
        warn(f"--no-auth: the SuperLink on {host} admits any SuperNode that reaches it (TLS stays on)")
    return True, not no_auth


def warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def certificates(out: Path, hosts: Sequence[str], days: int = 365) -> Path:
    """A CA and a SuperLink server certificate for `hosts` (IP addresses and DNS names) in `out`.

    Writes ``ca.crt``/``ca.key`` (kept if present, so devices that trust the CA keep trusting it) and
    ``server.pem``/``server.key`` (re-issued when it does not name every host). The certificate always names
    localhost, 127.0.0.1 and ::1 (the SuperLink's own SuperExec connects there when it binds a wildcard); a
    wildcard host itself is not a name. For tests and your own federations: docs/deployment.md#certificates.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys([*LOOPBACK_SANS, *(h for h in hosts if not _is_wildcard(h))]))
    ips, dns = [], []
    for h in names:
        try:
            ips.append(ipaddress.ip_address(h))
        except ValueError:
            dns.append(h)
    if (out / "server.pem").exists() and (out / "ca.crt").exists():
        san = x509.load_pem_x509_certificate((out / "server.pem").read_bytes()).extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
        if set(ips) <= set(san.get_values_for_type(x509.IPAddress)) and set(dns) <= set(san.get_values_for_type(x509.DNSName)):
            return out
    now = datetime.datetime.now(datetime.timezone.utc)
    ca, ca_key = _certificate_authority(out, names, now, days)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "superlink")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([*(x509.DNSName(d) for d in dns), *(x509.IPAddress(i) for i in ips)]),
                           critical=False)
            .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (out / "server.key").write_bytes(_pem_key(key))
    (out / "server.key").chmod(0o600)
    (out / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return out


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _certificate_authority(out: Path, names: list[str], now: datetime.datetime, days: int):
    """The CA in `out` (ca.crt + ca.key), made there if absent; returns (certificate, key). Your own CA without its
    key cannot issue a certificate for new names: one line says so."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    if (out / "ca.crt").exists() and not (out / "ca.key").exists():  # your own CA's certificates: never replaced
        raise ArgError(f"the server certificate in {out} does not name {', '.join(names)}, and there is no ca.key to "
                       f"issue one; expected a server.pem for these names (or remove {out} to make a new CA)")
    if (out / "ca.crt").exists():
        return (x509.load_pem_x509_certificate((out / "ca.crt").read_bytes()),
                serialization.load_pem_private_key((out / "ca.key").read_bytes(), None))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hetfl-ca")])
    ca = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (out / "ca.key").write_bytes(_pem_key(ca_key))
    (out / "ca.key").chmod(0o600)
    (out / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return ca, ca_key


def node_keys(home: Path, n: int) -> list[Path]:
    """One ECDSA P-384 key pair per SuperNode: `<home>/keys/node-<i>.key` (OpenSSH private) and `.pub`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = home / "keys"
    d.mkdir(parents=True, exist_ok=True)
    keys = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP384R1())
        path = d / f"node-{i}.key"
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
        path.with_suffix(".pub").write_bytes(
            key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
        keys.append(path)
    return keys


def register_node(link: launch.SuperLink, public_key: Path) -> None:
    """Admit a SuperNode's public key (`flwr supernode register`, through the SuperLink's Control API)."""
    subprocess.run([launch._bin("flwr"), "supernode", "register", str(public_key), link.connection],
                   env=launch.flwr_env(link.home), cwd=ROOT, check=True, capture_output=True)


@contextlib.contextmanager
def superlink(home: Path, host: str = "127.0.0.1", port: int | None = None, tls: bool = False, auth: bool = False,
              sans: Sequence[str] = (), state_file: bool = True) -> Iterator[launch.SuperLink]:
    """A deployment SuperLink on `host`:`port`; with `tls`, a certificate for `host` and `sans` in `<home>/certs`.
    `state_file`: its state in `<home>/state.db` (it survives a restart), else in memory."""
    args: list[str] = []
    if tls or auth:
        certs = certificates(home / "certs", [host, *sans])
        args = ["--ssl-ca-certfile", str(certs / "ca.crt"), "--ssl-certfile", str(certs / "server.pem"),
                "--ssl-keyfile", str(certs / "server.key")]
    if auth:
        args.append("--enable-supernode-auth")
    with launch.superlink(home, simulation=False, extra_args=args, tls=bool(args), host=host, port=port,
                          state_file=state_file) as link:
        yield link


RUNTIME_PORT = 9094  # a SuperNode's Runtime API (its SuperExec's side), on 127.0.0.1: Flower's default


def supernode_command(superlink_address: str, node_config: dict[str, Any], root_certificates: Path | None = None,
                      auth_key: Path | None = None, port: int | None = None, max_retries: int | None = None,
                      warm: bool = True) -> list[str]:
    """The flower-supernode command line of one SuperNode (no `root_certificates`: plain text). `warm`: its
    ClientApps are started by :func:`superexec_command`'s SuperExec (Flower's process isolation), else by Flower's."""
    cmd = [launch._bin("flower-supernode"), "--superlink", superlink_address, "--node-config", node_config_arg(node_config)]
    cmd += ["--root-certificates", str(root_certificates)] if root_certificates else ["--insecure"]
    if auth_key:
        cmd += ["--auth-supernode-private-key", str(auth_key)]
    if warm:
        cmd += ["--isolation", "process"]
    cmd += ["--port", str(port or RUNTIME_PORT)]
    if max_retries is not None:
        cmd += ["--max-retries", str(max_retries)]
    return cmd


def superexec_command(supernode: list[str], supernode_pid: int) -> list[str] | None:
    """The warm SuperExec (:mod:`hetfl.superexec`) of the SuperNode started with `supernode` as `supernode_pid`
    (it exits with it); None for a SuperNode that starts its own (Flower's subprocess isolation)."""
    if "--isolation" not in supernode or supernode[supernode.index("--isolation") + 1] != "process":
        return None
    port = supernode[supernode.index("--port") + 1]
    return [sys.executable, "-m", "hetfl.superexec", "--runtime-api-address", f"127.0.0.1:{port}", "--insecure",
            "--parent-pid", str(supernode_pid)]


# --- role local: a SuperLink and N SuperNodes on this machine -------------------------------------------------------

@dataclass
class Cluster:
    """A running SuperLink and its SuperNodes."""

    link: launch.SuperLink
    nodes: dict[int, subprocess.Popen] = field(default_factory=dict)  # partition id -> SuperNode process
    execs: dict[int, Any] = field(default_factory=dict)  # partition id -> its warm SuperExec (a ForkedProcess)
    pool: Any = None  # the hetfl.superexec.Pool that forks the SuperExecs (None: SuperNodes without warm SuperExecs)
    configs: dict[int, dict[str, Any]] = field(default_factory=dict)
    tls: bool = False
    commands: dict[int, tuple[list[str], dict[str, str], Path]] = field(default_factory=dict)  # argv, env, log

    def start_node(self, i: int, cmd: list[str], env: dict[str, str], log_file: Path, superexec: bool = True) -> None:
        """Start SuperNode `i` and (`superexec`) its warm SuperExec, if it has one (each in its own process session,
        so that stopping them stops their ClientApps), both logging to `log_file`. The SuperExec is forked by the
        cluster's :class:`~hetfl.superexec.Pool`."""
        self.commands[i] = (cmd, env, log_file)
        with open(log_file, "ab") as out:
            self.nodes[i] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if superexec:
            self.start_superexec(i)

    def start_superexec(self, i: int) -> None:
        """The warm SuperExec of SuperNode `i`, forked by the cluster's pool (none for a node that starts its own
        ClientApps)."""
        cmd, _env, log_file = self.commands[i]
        exec_cmd = superexec_command(cmd, self.nodes[i].pid)
        if exec_cmd:
            assert self.pool is not None, "a warm SuperNode needs the cluster's SuperExec pool"
            self.execs[i] = self.pool.start(exec_cmd[exec_cmd.index("hetfl.superexec") + 1:], log_file)

    def _live_execs(self, ids: Iterable[int] | None = None) -> list[Any]:
        """The SuperExecs (of nodes `ids`, default all) still running (a gone one's pid may be another process's by
        now)."""
        return [self.execs[i] for i in (self.execs if ids is None else ids)
                if i in self.execs and self.execs[i].poll() is None]

    def _node(self, i: int) -> list[Any]:
        return [self.nodes[i], *self._live_execs([i])]

    def restart_node(self, i: int, graceful: bool = True) -> None:
        """Stop SuperNode `i` and start it again with the same node config (same client ids, new node id).

        `graceful` stops it as a service manager does (SIGTERM, then SIGKILL after 10 s): the SuperNode deactivates
        its node id on the way out, so the SuperLink answers a message still addressed to it with 'Node Unavailable'
        at once. Without it the node is killed (a crash): that answer comes only when its heartbeats have been
        missed for HEARTBEAT_PATIENCE x 30 s (Flower 1.41), or at the round timeout.
        """
        if graceful:
            launch.stop_tree(self._node(i), timeout=10.0)
        else:
            self.kill_node(i)
        self.start_node(i, *self.commands[i])

    def kill_node(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Kill SuperNode `pid`, its SuperExec and its ClientApp processes (fault-injection: a device's crash)."""
        procs = self._node(pid)
        for p in launch.process_tree({proc.pid for proc in procs}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def stop(self) -> None:
        """Stop every SuperNode and SuperExec (whole process trees) and the SuperExec pool, then the SuperLink."""
        launch.stop_tree([*self.nodes.values(), *self._live_execs(), *([self.pool.proc] if self.pool else [])],
                         timeout=10.0)
        if self.pool:
            self.pool.close()
        self.link.stop()

    def pids(self) -> list[int]:
        """Every live process of the cluster (for leak checks)."""
        return launch.process_tree({self.link.proc.pid} | {p.pid for p in (*self.nodes.values(), *self._live_execs())}
                                   | ({self.pool.proc.pid} if self.pool else set()))


@contextlib.contextmanager
def local_cluster(num_nodes: int, home: Path | None = None, tls: bool = False, auth: bool = False,
                  configs: list[dict[str, Any]] | None = None, wait: bool = True, host: str = "127.0.0.1",
                  port: int | None = None, sans: Sequence[str] = (), warm: bool = True,
                  state_file: bool = True) -> Iterator[Cluster]:
    """Start a SuperLink (deployment, not simulation) on `host` and `num_nodes` SuperNodes here; stop all on exit.
    `warm` (the default): each SuperNode's ClientApps start warm (:mod:`hetfl.superexec`), else as Flower starts them.
    `state_file` (the default): the SuperLink keeps its state in `<home>/state.db`, else in memory (:func:`superlink`).

    The node configs are checked (:func:`check_node_config`) before anything starts.
    """
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="hetfl-cluster-")) if home is None else home
    home.mkdir(parents=True, exist_ok=True)
    configs = [check_node_config(c) for c in configs or [node_profile(i, num_nodes) for i in range(num_nodes)]]
    tls = tls or auth
    with superlink(home, host, port, tls=tls, auth=auth, sans=sans, state_file=state_file) as link:
        cluster = Cluster(link, tls=tls)
        keys: list[Path | None] = [None] * len(configs)
        if auth:
            keys = list(node_keys(home, len(configs)))
            for key in keys:  # admitted before the nodes connect
                register_node(link, key.with_suffix(".pub"))
        try:
            if warm:  # one warm-up for all nodes' SuperExecs (docs/deployment.md#warm-superexec)
                from hetfl.superexec import Pool

                cluster.pool = Pool(launch.flwr_env(home), home / "superexec-pool.log")
            ports: list[int] = []  # each node's own: nodes bind theirs after they start
            for i, cfg in enumerate(configs):
                ports.append(launch.free_port(*ports))
                cmd = supernode_command(link.address, cfg, home / "certs" / "ca.crt" if tls else None, keys[i],
                                        port=ports[-1], max_retries=50, warm=warm)
                cluster.start_node(i, cmd, launch.flwr_env(home), home / f"supernode-{i}.log", superexec=False)
                cluster.configs[i] = cfg
            for i in cluster.nodes:  # the pool warms up while the SuperNodes start
                cluster.start_superexec(i)
            time.sleep(1.0)
            dead = sorted({i for procs in (cluster.nodes, cluster.execs) for i, p in procs.items() if p.poll() is not None})
            if dead:
                raise RuntimeError(f"SuperNodes {dead} exited at start; see {home}/supernode-<i>.log")
            yield cluster
        finally:
            cluster.stop()


def stopped_line(run_dir: Path, rc: int) -> str | None:
    """One line for a run that stopped before its last round with a checkpoint to resume from (the SuperLink went
    away mid-run: a restart takes the runs' ServerApps with it): the last checkpointed round and how to go on. None
    when the run left no metrics.json or no checkpoint. A round recorded but not yet checkpointed when the run
    stopped is trained again by the resumed run (same seeds: the same row)."""
    from hetfl.common.checkpoint import read_checkpoint_entry
    from hetfl.common.results import load_metrics
    from hetfl.methods import SCHEMA

    if not (run_dir / "metrics.json").is_file() or not (run_dir / "checkpoint.json").is_file():
        return None
    total = int(load_metrics(run_dir / "metrics.json", SCHEMA)["config"]["num-server-rounds"])
    done = int(read_checkpoint_entry(run_dir / "checkpoint.json", "round", 0))
    if done >= total:
        return None
    return (f"run {run_dir.name!r} stopped after round {done} of {total} (flwr exit {rc}: the SuperLink or the "
            f"ServerApp went away); its checkpoint is in {run_dir}: submit the same run config again with "
            f"resume = true and run-name = \"{run_dir.name}\" to continue from round {done + 1}")


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
        raise RuntimeError(stopped_line(run_dir, rc) or f"run failed (flwr exit {rc}); no {run_dir / 'metrics.json'}")
    data = json.loads((run_dir / "metrics.json").read_text())
    # The run's own records decide, not flwr's exit code: when the SuperLink restarts mid-run, `flwr run --stream`
    # may end with 0 (the restarted SuperLink reports the run over) or not, depending on when its stream breaks.
    if not data.get("stopped") and not launch.completed(data):
        raise RuntimeError(stopped_line(run_dir, rc) or f"run failed after {data['summary']['rounds_completed']} "
                                                        f"rounds (flwr exit {rc}) and left no checkpoint to resume from")
    launch.check_outcome(data)
    return run_dir


# --- command line ----------------------------------------------------------------------------------------------------

def _parser(prog: str = "python -m hetfl.cluster") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run a deployment: a SuperLink and SuperNodes on this machine "
                                "(local), the SuperLink of devices elsewhere (superlink), or one device (supernode); "
                                "docs/deployment.md.")
    p.add_argument("role", nargs="?", default="local", choices=("local", "superlink", "supernode"),
                   help="local: SuperLink + --nodes SuperNodes here (default); superlink: the server alone; "
                        "supernode: one device of a remote SuperLink")
    p.add_argument("--home", help="FLWR_HOME of this role (logs, state, certs, keys); default: .flwr/cluster (local) "
                                  "and .flwr/superlink in the project; supernode: ~/.flwr/supernode-<client-id> (or "
                                  "-p<partition-id>), one per node, so that SuperNodes on one host never share one")
    p.add_argument("--debug", action="store_true", help="show tracebacks of configuration errors")
    s = p.add_argument_group("SuperLink (roles local and superlink)")
    s.add_argument("--address", default="127.0.0.1",
                   help="address the SuperLink serves its Fleet and Control APIs on (one port); not loopback = "
                        "reachable from other hosts, TLS and SuperNode authentication on by default (default 127.0.0.1)")
    s.add_argument("--port", type=int, help=f"its port (default: a free port on loopback, else {DEFAULT_PORT})")
    s.add_argument("--san", action="append", default=[], metavar="NAME",
                   help="another IP address or host name devices use to reach the SuperLink (server certificate); "
                        "repeatable, required with a wildcard --address")
    s.add_argument("--tls", action="store_true", help="loopback: TLS between SuperNodes/CLI and the SuperLink")
    s.add_argument("--auth", action="store_true", help="loopback: TLS + SuperNode authentication")
    s.add_argument("--insecure", action="store_true", help="no TLS and no SuperNode authentication (warns off loopback)")
    s.add_argument("--no-auth", action="store_true", help="TLS, but admit any SuperNode (warns off loopback)")
    s.add_argument("--state", choices=("file", "memory"),
                   help="file (default): the SuperLink's state (runs, registered keys, messages) in <home>/state.db, "
                        "kept across a restart; memory: in RAM, lost when it stops, and about a third of the "
                        "SuperLink's CPU per model it passes on (docs/deployment.md#superlink-state)")
    lo = p.add_argument_group("role local")
    lo.add_argument("--nodes", type=int, default=4, help="SuperNodes to start here (default 4)")
    lo.add_argument("--submit", metavar="PRESET", help="run this preset to the end, then stop the cluster")
    launch.add_run_config_args(lo)
    d = p.add_argument_group("role supernode")
    d.add_argument("--superlink", metavar="HOST:PORT", help="the SuperLink's address")
    d.add_argument("--root-certificates", metavar="CA.CRT", help="the CA certificate the SuperLink's certificate is "
                                                                 "issued by (copied from the server)")
    d.add_argument("--auth-key", metavar="KEY", help="this device's private key (ssh-keygen -t ecdsa -b 384; its .pub "
                                                     "is registered with flwr supernode register)")
    d.add_argument("--node-config", metavar="'K=V ...'", help="this device's node config, e.g. 'partition-id=0 "
                                                              "num-partitions=3 device-class=\"hpc\" capacity=\"weak\"'")
    d.add_argument("--runtime-port", type=int, metavar="PORT",
                   help="the port of this SuperNode's Runtime API on 127.0.0.1, where its SuperExec connects "
                        f"(Flower's default is {RUNTIME_PORT}); default: a free port, so that several SuperNodes can "
                        "run on one host")
    return p


def _check_runtime_port(port: int | None) -> int:
    """The supernode role's Runtime API port: `port` if it is free on 127.0.0.1, else a free one (None)."""
    import socket

    if port is None:
        return launch.free_port()
    if not 0 < port < 65536:
        raise ArgError(f"--runtime-port {port} is not allowed; expected an int in [1, 65535]")
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ArgError(f"--runtime-port {port}: 127.0.0.1:{port} is in use (another SuperNode on this host?); "
                           "expected a free port, or no --runtime-port for a free one") from None
    return port


def default_node_home(node_config: dict[str, Any]) -> Path:
    """A device's FLWR_HOME when --home is not given: one per node of this host, named by its client or partition id."""
    if "client-id" in node_config:
        return Path.home() / ".flwr" / f"supernode-{node_config['client-id']}"
    if "partition-id" in node_config:
        return Path.home() / ".flwr" / f"supernode-p{node_config['partition-id']}"
    return Path.home() / ".flwr" / "supernode"


def lock_home(home: Path) -> Any:
    """Hold `home` for this SuperNode for as long as the returned file stays open; ArgError in one line when another
    live SuperNode holds it (two SuperNodes in one FLWR_HOME would share Flower's installed apps and logs)."""
    import fcntl

    try:
        home.mkdir(parents=True, exist_ok=True)
        f = open(home / "supernode.lock", "a+")  # noqa: SIM115 - held open for the process's life
    except OSError as err:
        raise ArgError(f"--home {str(home)!r} cannot hold this SuperNode's lock ({err.strerror}); expected a "
                       "writable directory") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise ArgError(f"--home {str(home)!r} is in use by another SuperNode (pid {holder}); expected a home of this "
                       "node's own (--home DIR, or a distinct client-id for the default ~/.flwr/supernode-<client-id>)"
                       ) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _check_file(flag: str, path: str | None, what: str) -> Path:
    if not path:
        raise ArgError(f"{flag} is missing; expected {what}")
    if not Path(path).is_file():
        raise ArgError(f"{flag} {path!r} does not exist; expected {what}")
    return Path(path)


def _check_pem_certificate(flag: str, path: str | None) -> Path:
    from cryptography import x509

    p = _check_file(flag, path, "the CA certificate (PEM) from the server, e.g. <superlink home>/certs/ca.crt")
    try:
        x509.load_pem_x509_certificate(p.read_bytes())
    except ValueError:
        raise ArgError(f"{flag} {str(p)!r} is not a PEM certificate; expected the server's ca.crt") from None
    return p


def _check_private_key(flag: str, path: str | None) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    what = "this device's private key (ssh-keygen -q -t ecdsa -b 384 -N '' -f supernode.key)"
    p = _check_file(flag, path, what)
    data = p.read_bytes()
    key = None
    for load in (serialization.load_ssh_private_key, serialization.load_pem_private_key):
        with contextlib.suppress(Exception):  # not this format
            key = load(data, None)
            break
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ArgError(f"{flag} {str(p)!r} is not an unencrypted ECDSA private key; expected {what}")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m hetfl.cluster") -> int:
    a = _parser(prog).parse_args(argv)
    launch.setup_signals()
    try:
        with launch.config_errors(a.debug):
            plan = _check_args(a)  # everything checked before any process starts
    except SystemExit as err:
        return int(err.code or 0)
    try:
        return {"local": _run_local, "superlink": _run_superlink, "supernode": _run_supernode}[a.role](a, plan)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 0


def _check_args(a: argparse.Namespace) -> dict[str, Any]:
    default_home = {"local": ROOT / ".flwr" / "cluster", "superlink": ROOT / ".flwr" / "superlink",
                    "supernode": Path.home() / ".flwr"}[a.role]  # a device: Flower's own default, as flower-supernode
    plan: dict[str, Any] = {"home": Path(a.home or default_home).expanduser().resolve()}
    if a.role == "supernode":
        return _check_supernode(a, plan)
    for flag in ("--superlink", "--root-certificates", "--auth-key", "--node-config", "--runtime-port"):
        if getattr(a, flag[2:].replace("-", "_")):
            raise ArgError(f"{flag} is for the supernode role (python -m hetfl.cluster supernode ...)")
    host = check_host("--address", a.address)
    if a.port is not None and not 0 < a.port < 65536:
        raise ArgError(f"--port {a.port} is not allowed; expected an int in [1, 65535]")
    sans = [check_host("--san", s) for s in a.san]
    plan["tls"], plan["auth"] = security(host, a.tls, a.auth, a.insecure, a.no_auth)
    if plan["tls"] and _is_wildcard(host) and not sans:
        raise ArgError(f"--address {host} serves every interface; name the addresses devices use for the server "
                       "certificate with --san (e.g. --san 10.0.0.5 --san server.lan)")
    plan["host"], plan["sans"], plan["state_file"] = host, sans, a.state != "memory"
    if plan["tls"]:  # issued (or checked) now, so that a certificate problem is one line before anything starts
        certificates(plan["home"] / "certs", [host, *sans])
    plan["port"] = a.port or (None if is_loopback(host) else DEFAULT_PORT)
    if a.role == "superlink":
        if a.submit or a.set:
            raise ArgError("--submit/--set run on local SuperNodes (role local); with a remote federation submit from "
                           "your laptop with flwr run (docs/deployment.md)")
        return plan
    if a.nodes < 1:
        raise ArgError(f"--nodes {a.nodes} is not allowed; expected an int >= 1 (the SuperLink alone: role superlink)")
    if a.submit:  # the run too
        launch.preflight({**launch.load_preset(a.submit), "min-available-nodes": a.nodes, **launch.overrides_of(a)},
                         a.nodes)
    return plan


def _check_supernode(a: argparse.Namespace, plan: dict[str, Any]) -> dict[str, Any]:
    """The supernode role's checks (:func:`_check_args`): its flags, the SuperLink's address, the node config, the
    certificate and key, the Runtime API port and the node's own home."""
    for flag in ("--submit", "--set", "--address", "--port", "--san", "--tls", "--auth", "--state"):
        if getattr(a, flag[2:].replace("-", "_")) not in (None, [], False, "127.0.0.1"):
            raise ArgError(f"{flag} is for the SuperLink roles; a supernode takes --superlink, --root-certificates, "
                           "--auth-key and --node-config")
    if not a.superlink:
        raise ArgError("--superlink is missing; expected the SuperLink's host:port, e.g. 10.0.0.5:8000")
    check_superlink(a.superlink)
    if not a.node_config:
        raise ArgError("--node-config is missing; expected e.g. 'partition-id=0 num-partitions=3 device-class=\"hpc\" "
                       "capacity=\"weak\"'")
    from hetfl.common.nodeconfig import NodeConfigError, parse_node_config

    try:
        plan["node_config"] = check_node_config(parse_node_config(a.node_config))
    except NodeConfigError as err:
        raise ArgError(str(err)) from None
    if a.insecure:
        warn(f"--insecure: this SuperNode talks to {a.superlink} in plain text, without authentication")
    else:
        plan["ca"] = _check_pem_certificate("--root-certificates", a.root_certificates)
    if not (a.insecure or a.no_auth):
        plan["key"] = _check_private_key("--auth-key", a.auth_key)
    for key, word in (("device-class", "SHEFL"), ("capacity", "AdaptiveFL")):
        if key not in plan["node_config"]:
            warn(f"node config has no {key!r}: {word} runs draw this device's profile from its partition id, "
                 "as in simulation (docs/deployment.md#device-profile)")
    plan["runtime_port"] = _check_runtime_port(a.runtime_port)
    if not a.home:
        plan["home"] = default_node_home(plan["node_config"]).resolve()
    plan["home_lock"] = lock_home(plan["home"])  # last: nothing after it can fail
    return plan


def _connection_help(link: launch.SuperLink, plan: dict[str, Any]) -> tuple[str, str]:
    """The laptop's connection block for this SuperLink, and the address devices use."""
    host = plan["sans"][0] if _is_wildcard(plan["host"]) else plan["host"]
    address = launch.connect_address(host, int(link.address.rsplit(":", 1)[1]))
    security_line = 'root-certificates = "/path/to/ca.crt"' if plan["tls"] else "insecure = true"
    return f"[superlink.hetfl-remote]\naddress = \"{address}\"\n{security_line}", address


def _run_local(a: argparse.Namespace, plan: dict[str, Any]) -> int:
    with local_cluster(a.nodes, plan["home"], tls=plan["tls"], auth=plan["auth"], host=plan["host"], port=plan["port"],
                       sans=plan["sans"], state_file=plan["state_file"]) as cluster:
        print(f"SuperLink {cluster.link.address} (FLWR_HOME={plan['home']}, connection '{cluster.link.connection}'"
              f"{', TLS' if plan['tls'] else ''}{', SuperNode authentication' if plan['auth'] else ''}), "
              f"{len(cluster.nodes)} SuperNodes:")
        for i, cfg in cluster.configs.items():
            print(f"  supernode {i}: pid {cluster.nodes[i].pid}  node-config {node_config_arg(cfg)}")
        if a.submit:
            run_dir = submit(cluster, a.submit, launch.overrides_of(a))
            s = json.loads((run_dir / "metrics.json").read_text())["summary"]
            print(f"final accuracy {100 * s['final_accuracy']:.2f}%; results: {run_dir}")
            return 0
        print(f"\nSubmit runs from another shell:\n  FLWR_HOME={plan['home']} FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 "
              f".venv/bin/flwr run . {cluster.link.connection} --stream --run-config "
              f"'num-server-rounds=3 min-available-nodes={a.nodes} fraction-train=1.0'\n"
              f"(a preset file instead of key=value pairs works when its min-available-nodes is <= {a.nodes}). "
              "Ctrl-C stops the cluster.", flush=True)
        while all(p.poll() is None for p in cluster.nodes.values()) and cluster.link.proc.poll() is None:
            time.sleep(1.0)
        print("a SuperNode or the SuperLink exited; stopping the cluster")
    return 0


def _run_superlink(a: argparse.Namespace, plan: dict[str, Any]) -> int:
    with superlink(plan["home"], plan["host"], plan["port"], tls=plan["tls"], auth=plan["auth"], sans=plan["sans"],
                   state_file=plan["state_file"]) as link:
        block, address = _connection_help(link, plan)
        certs = plan["home"] / "certs"
        print(f"SuperLink serving on {plan['host']}:{link.address.rsplit(':', 1)[1]} (pid {link.proc.pid}; "
              f"{'TLS' if plan['tls'] else 'plain text'}, SuperNode authentication {'on' if plan['auth'] else 'off'}, "
              f"state {plan['home'] / 'state.db' if plan['state_file'] else 'in memory'}); "
              f"log {plan['home'] / 'superlink.log'}", flush=True)
        if plan["tls"]:
            print(f"  copy {certs / 'ca.crt'} to every device and to your laptop", flush=True)
        print("  laptop, in ~/.flwr/config.toml:\n" + "\n".join(f"    {line}" for line in block.splitlines()), flush=True)
        if plan["auth"]:
            print("  register each device's public key: flwr supernode register supernode.key.pub hetfl-remote", flush=True)
        print(f"  each device: flower-supernode --superlink {address} "
              f"{'--root-certificates ca.crt ' if plan['tls'] else '--insecure '}"
              f"{'--auth-supernode-private-key supernode.key ' if plan['auth'] else ''}"
              "--node-config \"client-id=<i> data-path=\\\"$HOME/data\\\" device-class=\\\"hpc\\\" capacity=\\\"weak\\\"\"\n"
              "Ctrl-C or SIGTERM stops the SuperLink and every ServerApp it runs.", flush=True)
        link.proc.wait()
        print(f"the SuperLink exited with {link.proc.returncode}; see {plan['home'] / 'superlink.log'}", file=sys.stderr)
    return 1


def _run_supernode(a: argparse.Namespace, plan: dict[str, Any]) -> int:
    home = plan["home"]  # made and locked by _check_supernode
    cmd = supernode_command(a.superlink, plan["node_config"], plan.get("ca"), plan.get("key"), port=plan["runtime_port"])
    print(f"SuperNode of {a.superlink} (FLWR_HOME={home}): {' '.join(cmd[1:])}", flush=True)
    held = (plan["home_lock"].fileno(),)  # the SuperNode and its SuperExec hold the home's lock too (a killed wrapper)
    proc = subprocess.Popen(cmd, env=launch.flwr_env(home), start_new_session=True, pass_fds=held)
    procs = [proc, subprocess.Popen(superexec_command(cmd, proc.pid), env=launch.flwr_env(home), start_new_session=True,
                                    pass_fds=held)]
    try:
        return proc.wait()
    finally:
        launch.stop_tree(procs, timeout=10.0)


if __name__ == "__main__":
    sys.exit(main())
