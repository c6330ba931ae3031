"""The Docker Compose files: valid structure, pinned Flower images, node configs as in simulation."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"


def _flwr_version() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in deps if d.startswith("flwr[")).split("==")[1]


def _compose(*names: str) -> dict:
    """Merge compose files the way `docker compose -f a -f b` does for the keys used here."""
    merged: dict = {"services": {}}
    for n in names:
        doc = yaml.safe_load((DOCKER / n).read_text())
        for svc, spec in doc["services"].items():
            merged["services"].setdefault(svc, {}).update(spec)
    return merged


def _node_config(cmd: list[str]) -> dict[str, str]:
    text = cmd[cmd.index("--node-config") + 1]
    return {k: v.strip('"') for k, v in (kv.split("=", 1) for kv in text.split())}


def test_compose_cluster_topology():
    base = yaml.safe_load((DOCKER / "compose.yml").read_text())
    services = base["services"]
    v = _flwr_version()
    assert services["superlink"]["image"].endswith(f":${{FLWR_VERSION:-{v}}}")
    assert f"ARG FLWR_VERSION={v}" in (DOCKER / "Dockerfile").read_text()
    nodes = sorted(s for s in services if s.startswith("supernode-"))
    assert len(nodes) == 4
    cfgs = [_node_config(services[s]["command"]) for s in nodes]
    assert [c["partition-id"] for c in cfgs] == ["0", "1", "2", "3"] and {c["num-partitions"] for c in cfgs} == {"4"}
    assert {c["device-class"] for c in cfgs} == {"hpc", "lpc"} and {c["capacity"] for c in cfgs} == {"weak", "medium", "strong"}
    for i, s in enumerate(nodes):  # one ClientApp SuperExec per SuperNode, talking to that node's runtime API
        cmd = services[f"superexec-clientapp-{i}"]["command"]
        assert cmd[cmd.index("--runtime-api-address") + 1] == f"{s}:9094"
    assert services["superexec-serverapp"]["command"][-1] == "superlink:8000"


def test_tls_and_auth_overlays():
    tls = _compose("compose.yml", "compose.tls.yml")["services"]
    assert "--insecure" not in tls["superlink"]["command"] and "--ssl-certfile" in tls["superlink"]["command"]
    for s in (f"supernode-{i}" for i in range(4)):
        assert "--root-certificates" in tls[s]["command"] and "--insecure" not in tls[s]["command"]
    auth = _compose("compose.yml", "compose.tls.yml", "compose.auth.yml")["services"]
    assert "--enable-supernode-auth" in auth["superlink"]["command"]
    assert all("--auth-supernode-private-key" in auth[f"supernode-{i}"]["command"] for i in range(4))
    # node configs unchanged by the overlays
    assert [_node_config(auth[f"supernode-{i}"]["command"]) for i in range(4)] == \
           [_node_config(yaml.safe_load((DOCKER / "compose.yml").read_text())["services"][f"supernode-{i}"]["command"]) for i in range(4)]


@pytest.mark.skipif(not shutil.which("docker-compose"), reason="docker-compose CLI not installed (optional)")
def test_docker_compose_config_validates():
    for files in (["compose.yml"], ["compose.yml", "compose.tls.yml"], ["compose.yml", "compose.tls.yml", "compose.auth.yml"]):
        args = [a for f in files for a in ("-f", str(DOCKER / f))]
        subprocess.run(["docker-compose", *args, "config", "-q"], check=True, cwd=ROOT)


def test_cert_script_makes_a_server_cert_for_loopback(tmp_path):
    subprocess.run(["bash", str(DOCKER / "certs" / "generate.sh"), str(tmp_path)], check=True, capture_output=True)
    out = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "server.pem"), "-noout", "-text"],
                         check=True, capture_output=True, text=True).stdout
    assert "IP Address:127.0.0.1" in out and "DNS:superlink" in out
    subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "server.pem")], check=True,
                   capture_output=True)
