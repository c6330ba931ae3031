"""The Docker Compose cluster (docker/, docs/deployment.md "Docker Compose").

Static checks of the files everywhere; `docker-compose config` where Debian's docker-compose is installed; and the real
thing, the cluster run to the end on a Docker engine (docker/test-cluster.sh = `make test-docker`), only when asked
for with HETFL_DOCKER_TEST=1: it builds a ~7 GB image and takes minutes (too long for `make test`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
NODES = [f"supernode-{i}" for i in range(4)]


def _target(volume: str) -> str:
    return volume.split(":")[1]


def _compose(*names: str) -> dict:
    """Merge compose files as `docker-compose -f a -f b` does for the keys used here: an overlay's entrypoint and
    command replace the base's, its volumes are added, replacing those with the same container path."""
    merged: dict = {}
    for n in names:
        for svc, spec in yaml.safe_load((DOCKER / n).read_text())["services"].items():
            out = merged.setdefault(svc, {})
            for key, value in spec.items():
                if key == "volumes":
                    vols = {_target(v): v for v in out.get("volumes", [])}
                    vols.update({_target(v): v for v in value})
                    out["volumes"] = list(vols.values())
                elif key == "environment":
                    out["environment"] = {**out.get("environment", {}), **value}
                else:
                    out[key] = value
    return merged


def _argv(spec: dict) -> list[str]:
    return [*spec["entrypoint"], *spec.get("command", [])]


def _node_config(cmd: list[str]) -> dict[str, str]:
    text = cmd[cmd.index("--node-config") + 1]
    return {k: v.strip('"') for k, v in (kv.split("=", 1) for kv in text.split())}


def test_compose_cluster_topology():
    services = _compose("compose.yml")
    assert {s["image"] for s in services.values()} == {"${HETFL_IMAGE:-hetfl:latest}"}   # built here, no registry
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", (DOCKER / "Dockerfile").read_text(), re.M)
    assert "ARG BASE_IMAGE=hetfl-base:bookworm" in (DOCKER / "Dockerfile").read_text()
    link = _argv(services["superlink"])
    assert link[:2] == ["flower-superlink", "--insecure"] and link[link.index("--isolation") + 1] == "subprocess"
    assert link[link.index("--port") + 1] == "8000"
    assert sorted(s for s in services if s.startswith("supernode-")) == NODES
    cfgs = [_node_config(services[s]["command"]) for s in NODES]
    assert [c["client-id"] for c in cfgs] == ["0", "1", "2", "3"] and {c["data-path"] for c in cfgs} == {"/data"}
    assert not any("partition-id" in c for c in cfgs)  # a node holds its own data, not a slice of a global copy
    assert {c["device-class"] for c in cfgs} == {"hpc", "lpc"} and {c["capacity"] for c in cfgs} == {"weak", "medium", "strong"}
    for s in NODES:
        argv = _argv(services[s])
        assert argv[:2] == ["flower-supernode", "--insecure"] and argv[argv.index("--superlink") + 1] == "superlink:8000"
        assert "--isolation" not in argv   # subprocess (Flower's default): the ClientApps run in the node's container
        # node-local data: one volume, read-only, nothing else of the host
        assert services[s]["volumes"] == [f"${{HETFL_DATA:-../data}}/client-{NODES.index(s)}:/data:ro"]
    assert services["cli"]["profiles"] == ["cli"]


def test_tls_and_auth_overlays_change_only_security():
    base = _compose("compose.yml")
    tls = _compose("compose.yml", "compose.tls.yml")
    auth = _compose("compose.yml", "compose.tls.yml", "compose.auth.yml")
    for merged in (tls, auth):
        link = _argv(merged["superlink"])
        assert "--insecure" not in link and "--ssl-certfile" in link and merged["superlink"]["command"] == base["superlink"]["command"]
        for s in NODES:
            argv = _argv(merged[s])
            assert "--insecure" not in argv and argv[argv.index("--root-certificates") + 1] == "/certs/ca.crt"
            assert merged[s]["command"] == base[s]["command"]   # node configs are written once, in compose.yml
            assert set(base[s]["volumes"]) <= set(merged[s]["volumes"])   # the node's data stays mounted
        assert merged["cli"]["environment"]["HETFL_CONNECTION"] == "docker-tls"
    assert "--enable-supernode-auth" in _argv(auth["superlink"])
    for i, s in enumerate(NODES):
        argv = _argv(auth[s])
        assert argv[argv.index("--auth-supernode-private-key") + 1] == "/keys/supernode"
        assert f"./keys/supernode-{i}:/keys/supernode:ro" in auth[s]["volumes"]


def test_cli_connections_match_the_cluster():
    conns = tomllib.loads((DOCKER / "flwr-config.toml").read_text())["superlink"]
    assert conns["default"] == "docker" and conns["docker"] == {"address": "superlink:8000", "insecure": True}
    assert conns["docker-tls"]["root-certificates"] == "/certs/ca.crt"
    assert "./certs/out/ca.crt:/certs/ca.crt:ro" in _compose("compose.yml", "compose.tls.yml")["cli"]["volumes"]


def test_build_context_holds_what_the_dockerfile_uses():
    """Every COPY and bind-mount source of docker/Dockerfile is let through by .dockerignore (an allow-list)."""
    text = (DOCKER / "Dockerfile").read_text()
    sources = re.findall(r"source=(\S+?),", text)
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        sources += [a for a in line.split()[:-1] if not a.startswith("--")]
    allowed = [ln[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.startswith("!")]
    assert sources and all(any(s.rstrip("/") == a or s.startswith(a + "/") for a in allowed) for s in sources), sources
    assert all((ROOT / s).exists() for s in sources if not s.startswith("docker/.cache"))


@pytest.mark.parametrize("args, message", [
    (["configs/quickstart.toml", "bogus-key=1"], "unknown run-config key 'bogus-key'"),
    (["configs/nope.toml"], "preset 'configs/nope.toml' does not exist"),
])
def test_submit_rejects_bad_input_in_one_line(args, message):
    """hetfl-submit (the cli container's command) checks the run config before it contacts the SuperLink."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["bash", str(DOCKER / "submit.sh"), *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="docker-compose CLI not installed (optional: make compose-cli)")
def test_docker_compose_config_validates():
    for files in (["compose.yml"], ["compose.yml", "compose.tls.yml"], ["compose.yml", "compose.tls.yml", "compose.auth.yml"]):
        args = [a for f in files for a in ("-f", str(DOCKER / f))]
        subprocess.run(["docker-compose", *args, "config", "-q"], check=True, cwd=ROOT)


def test_cert_script_makes_a_server_cert_for_loopback_and_the_addresses_given(tmp_path):
    env = {**os.environ, "HETFL_SANS": "IP:10.77.0.1 DNS:server.lan"}
    subprocess.run(["bash", str(DOCKER / "certs" / "generate.sh"), str(tmp_path)], check=True, capture_output=True, env=env)
    out = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "server.pem"), "-noout", "-text"],
                         check=True, capture_output=True, text=True).stdout
    assert "IP Address:127.0.0.1" in out and "DNS:superlink" in out
    assert "IP Address:10.77.0.1" in out and "DNS:server.lan" in out
    bad = subprocess.run(["bash", str(DOCKER / "certs" / "generate.sh"), str(tmp_path / "bad")], capture_output=True,
                         text=True, env={**os.environ, "HETFL_SANS": "10.77.0.1"})
    assert bad.returncode == 2 and "expected IP:<address> or DNS:<name>" in bad.stderr
    subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "server.pem")], check=True,
                   capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("HETFL_DOCKER_TEST") != "1",
                    reason="real Docker engine run (builds a ~7 GB image, minutes): make test-docker, or HETFL_DOCKER_TEST=1")
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (apt-get, dockerd, debootstrap)")
@pytest.mark.skipif(not (shutil.which("dockerd") or shutil.which("apt-get")), reason="no dockerd and no apt-get to install it")
def test_compose_cluster_runs_two_rounds_on_a_real_engine():
    r = subprocess.run(["bash", str(DOCKER / "test-cluster.sh")], cwd=ROOT, capture_output=True, text=True, timeout=3600,
                       env={**os.environ, "ROUNDS": "2"})
    assert r.returncode == 0 and "2 rounds, 4 replies each" in r.stdout, (r.stdout[-6000:], r.stderr[-3000:])
