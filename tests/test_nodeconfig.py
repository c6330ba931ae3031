"""Node configs (device profiles) and the hetfl.cluster roles' checks, certificates and security defaults.

Fast: nothing here starts a SuperLink or a SuperNode (tests/test_multihost.py runs the real thing across hosts).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from hetfl import cluster, launch
from hetfl.methods import validate
from hetfl.common.nodeconfig import NodeConfigError, parse_node_config
from hetfl.methods import NODE_SCHEMA

validate_node_config = NODE_SCHEMA.validate

GOOD = {"partition-id": 1, "num-partitions": 3, "device-class": "lpc", "capacity": "medium"}


# --- the schema ------------------------------------------------------------------------------------------------------

def test_schema_has_the_common_keys_and_each_methods_device_profile():
    assert {"partition-id", "num-partitions", "data-path", "device-class", "capacity"} <= set(NODE_SCHEMA)
    assert validate_node_config(GOOD) == GOOD
    assert validate_node_config({"partition-id": 0, "num-partitions": 1}) == {"partition-id": 0, "num-partitions": 1}
    for capacity in (250_000, 2.5e5, "2e5"):  # a number of parameters (TOML int/float, or a numeric string)
        validate_node_config({**GOOD, "capacity": capacity})


@pytest.mark.parametrize("bad, words", [
    ({"device-class": "fast"}, ["'device-class' = 'fast'", "'hpc', 'lpc'"]),
    ({"device-class": 1}, ["'device-class' = 1", "'hpc', 'lpc'"]),
    ({"capacity": "huge"}, ["'capacity' = 'huge'", "'weak', 'medium', 'strong' or a number of parameters > 0"]),
    ({"capacity": -5}, ["'capacity' = -5", "> 0"]),
    ({"capacity": float("inf")}, ["'capacity' = inf", "> 0"]),
    ({"capacity": True}, ["'capacity' = True"]),
    ({"partition-id": -1}, ["'partition-id' = -1", "int >= 0"]),
    ({"partition-id": 3}, ["'partition-id' = 3", "[0, 3)"]),
    ({"num-partitions": 0, "partition-id": 0}, ["'num-partitions' = 0", "int >= 1"]),
    ({"data-path": ""}, ["'data-path' = ''", "non-empty"]),
    ({"device_class": "hpc"}, ["'device_class' = 'hpc' is not known", "'device-class'"]),
])
def test_a_bad_node_config_is_one_line_naming_key_value_and_allowed(bad, words):
    with pytest.raises(NodeConfigError) as err:
        validate_node_config({**GOOD, **bad})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("node config key ")
    for w in words:
        assert w in msg, msg


def test_node_config_strings_are_parsed_as_flower_supernode_parses_them(tmp_path):
    assert parse_node_config('partition-id=0 num-partitions=3 device-class="hpc" capacity=2e5') == \
        {"partition-id": 0, "num-partitions": 3, "device-class": "hpc", "capacity": 200000.0}
    toml = tmp_path / "node.toml"
    toml.write_text('partition-id = 2\nnum-partitions = 3\ncapacity = "strong"\n')
    assert parse_node_config(str(toml)) == {"partition-id": 2, "num-partitions": 3, "capacity": "strong"}
    with pytest.raises(NodeConfigError, match=r"'device-class=hpc' is not key=value with a TOML value.*double quotes"):
        parse_node_config("partition-id=0 device-class=hpc")


# --- the apps read the declared profile (and the simulated draw stays for simulation) -------------------------------

def _ctx(node_config: dict, run_config: dict) -> Context:
    return Context(1, 1, node_config, RecordDict(), run_config)


def test_shefl_device_class_is_declared_or_simulated():
    from hetfl.shefl_app.client_app import device_class
    from hetfl.shefl_app.core import hpc_partitions

    cfg = validate({"method": "shefl"})
    assert device_class(_ctx({**GOOD, "device-class": "hpc"}, cfg), cfg, 0) == "hpc"
    assert device_class(_ctx(GOOD, cfg), cfg, 0) == "lpc"
    drawn = hpc_partitions(10, cfg["shefl-hpc-fraction"], cfg["seed"])
    assert [device_class(_ctx({"partition-id": i, "num-partitions": 10}, cfg), cfg, i) for i in range(10)] == \
        ["hpc" if i in drawn else "lpc" for i in range(10)]
    with pytest.raises(NodeConfigError, match="'device-class' = 'HPC'"):
        device_class(_ctx({**GOOD, "device-class": "HPC"}, cfg), cfg, 0)


def test_adaptivefl_capacity_is_declared_or_simulated():
    from hetfl.adaptivefl_app.task import device_capacity, reference_pool

    cfg = validate({"method": "adaptivefl", "adaptivefl-tier-capacity": "fixed"})
    pool = reference_pool(cfg)
    assert device_capacity(_ctx(GOOD, cfg), cfg, 0)[0] == "medium"
    tier, cap = device_capacity(_ctx({**GOOD, "capacity": float(pool.tier_capacity("medium"))}, cfg), cfg, 0)
    assert tier == "medium" and cap.draw(np.random.default_rng(0)) == pool.tier_capacity("medium")
    assert device_capacity(_ctx({"partition-id": 0, "num-partitions": 10}, cfg), cfg, 0)[0] in cluster.tiers()
    with pytest.raises(NodeConfigError, match="'capacity' = 'tiny'"):
        device_capacity(_ctx({**GOOD, "capacity": "tiny"}, cfg), cfg, 0)


def test_discovery_refuses_a_bad_node_config_and_the_server_logs_why(caplog, monkeypatch, task_identity):
    from hetfl import client_app
    from hetfl.common import nodes

    query = Message(RecordDict({"config": ConfigRecord({})}), message_type="query.node", dst_node_id=7)
    ctx = _ctx({**GOOD, "capacity": "huge"}, validate({"method": "fedavg"}))
    with pytest.raises(NodeConfigError) as err:
        client_app.node_query(query, ctx)
    reason = f"{type(err.value)}:<'{err.value}'>"  # what Flower's ClientApp runner puts in the error reply
    good = Message(RecordDict({"config": ConfigRecord({"client-ids": [0]})}), reply_to=query)
    bad = Message(Error(code=2, reason=reason), reply_to=query)
    grid = SimpleNamespace(send_and_receive=lambda msgs, timeout: [good, bad])
    monkeypatch.setattr(nodes.log, "propagate", True)
    with caplog.at_level(logging.WARNING, logger="hetfl"):
        assert nodes.ask_nodes(grid, [7, 8], 5.0) == {int(good.metadata.src_node_id): {"client-ids": [0]}}
    assert any("did not answer discovery" in r.getMessage() and "'capacity' = 'huge'" in r.getMessage()
               for r in caplog.records)


# --- hetfl.cluster: roles, checks before anything starts, security defaults, certificates ---------------------------

@pytest.fixture
def nothing_starts(monkeypatch):
    def fail(*a, **k):
        pytest.fail("a process was started")

    for target, name in ((cluster, "superlink"), (cluster, "local_cluster"), (launch, "superlink"),
                         (cluster.subprocess, "Popen")):
        monkeypatch.setattr(target, name, fail)


@pytest.mark.parametrize("argv, words", [
    (["superlink", "--address", "0.0.0.0"], ["--address 0.0.0.0 serves every interface", "--san"]),
    (["superlink", "--address", "bad_host!"], ["--address 'bad_host!'", "IP address", "host name"]),
    (["superlink", "--address", "10.0.0.5", "--insecure", "--tls"], ["--insecure", "without --tls/--auth"]),
    (["superlink", "--port", "70000"], ["--port 70000", "[1, 65535]"]),
    (["superlink", "--submit", "configs/quickstart.toml"], ["--submit/--set", "flwr run"]),
    (["--nodes", "0"], ["--nodes 0", ">= 1"]),
    (["supernode"], ["--superlink is missing", "host:port"]),
    (["supernode", "--superlink", "10.0.0.5"], ["--superlink '10.0.0.5'", "host:port"]),
    (["supernode", "--superlink", "10.0.0.5:8000", "--node-config", 'partition-id=0 num-partitions=3 device-class="fast"'],
     ["'device-class' = 'fast'", "'hpc', 'lpc'"]),
    (["supernode", "--superlink", "10.0.0.5:8000", "--node-config", "partition-id=0 num-partitions=3 capacity=weak"],
     ["'capacity=weak'", "double quotes"]),
    (["supernode", "--superlink", "10.0.0.5:8000", "--node-config", "num-partitions=3"], ["lacks 'partition-id'"]),
    (["supernode", "--superlink", "10.0.0.5:8000", "--node-config", "partition-id=0 num-partitions=3"],
     ["--root-certificates is missing", "ca.crt"]),
    (["supernode", "--superlink", "10.0.0.5:8000", "--node-config", "partition-id=0 num-partitions=3",
      "--root-certificates", "/nonexistent/ca.crt"], ["'/nonexistent/ca.crt' does not exist"]),
    (["supernode", "--superlink", "10.0.0.5:8000", "--address", "10.0.0.6"], ["--address is for the SuperLink roles"]),
    (["supernode", "--superlink", "10.0.0.5:8000", "--state", "memory"], ["--state is for the SuperLink roles"]),
    (["--node-config", "partition-id=0"], ["--node-config is for the supernode role"]),
])
def test_bad_arguments_are_one_line_and_nothing_starts(argv, words, capsys, nothing_starts, tmp_path):
    assert cluster.main([*argv, "--home", str(tmp_path / "home")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and all(w in err[-1] for w in words), err


def test_supernode_checks_its_certificate_and_key(tmp_path, capsys, nothing_starts):
    certs = cluster.certificates(tmp_path / "certs", ["10.0.0.5"])
    base = ["supernode", "--superlink", "10.0.0.5:8000", "--node-config", "partition-id=0 num-partitions=3",
            "--home", str(tmp_path / "home")]
    assert cluster.main([*base, "--root-certificates", str(certs / "server.key")]) == 2
    assert "is not a PEM certificate" in capsys.readouterr().err
    assert cluster.main([*base, "--root-certificates", str(certs / "ca.crt")]) == 2
    assert "--auth-key is missing" in capsys.readouterr().err
    assert cluster.main([*base, "--root-certificates", str(certs / "ca.crt"), "--auth-key", str(certs / "ca.crt")]) == 2
    assert "is not an unencrypted ECDSA private key" in capsys.readouterr().err


def test_supernode_role_runs_flower_supernode_with_the_checked_config(tmp_path, capsys, monkeypatch):
    certs = cluster.certificates(tmp_path / "certs", ["10.0.0.5"])
    keys = [cluster.node_keys(tmp_path, 1)[0]]
    if shutil.which("ssh-keygen"):  # the README's key (OpenSSH format)
        subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(tmp_path / "sk")], check=True)
        keys.append(tmp_path / "sk")
    started = []

    class Proc:
        pid = 0

        def __init__(self, cmd, env, **kw):
            started.append((cmd, env))

        def wait(self, *a):
            return 0

        def poll(self):
            return 0

    monkeypatch.setattr(cluster.subprocess, "Popen", Proc)
    monkeypatch.setattr(launch, "process_tree", lambda roots: [])
    for key in keys:
        assert cluster.main(["supernode", "--superlink", "10.0.0.5:8000", "--root-certificates", str(certs / "ca.crt"),
                             "--auth-key", str(key), "--home", str(tmp_path / "home"), "--node-config",
                             'partition-id=2 num-partitions=3 device-class="lpc" capacity=300000']) == 0
        (cmd, env), (exe, exe_env) = started[-2:]  # the SuperNode, then its warm SuperExec on its Runtime API
        assert cmd[0].endswith("flower-supernode") and env["FLWR_HOME"] == str(tmp_path / "home")
        assert cmd[cmd.index("--isolation") + 1] == "process" and exe_env["FLWR_HOME"] == env["FLWR_HOME"]
        assert exe[1:3] == ["-m", "hetfl.superexec"]
        assert exe[exe.index("--runtime-api-address") + 1] == f"127.0.0.1:{cmd[cmd.index('--port') + 1]}"
        assert cmd[cmd.index("--node-config") + 1] == 'partition-id=2 num-partitions=3 device-class="lpc" capacity=300000'
        assert cmd[cmd.index("--root-certificates") + 1] == str(certs / "ca.crt")
        assert cmd[cmd.index("--auth-supernode-private-key") + 1] == str(key) and "--insecure" not in cmd
    assert "warning" not in capsys.readouterr().err  # the profile is declared
    assert cluster.main(["supernode", "--superlink", "10.0.0.5:8000", "--insecure", "--home", str(tmp_path / "home"),
                         "--node-config", "partition-id=0 num-partitions=3"]) == 0
    assert "--insecure" in started[-2][0] and "--auth-supernode-private-key" not in started[-2][0]
    err = capsys.readouterr().err
    assert "warning: --insecure" in err and "no 'device-class'" in err and "no 'capacity'" in err


def test_security_is_on_by_default_off_loopback_and_opt_out_warns(capsys):
    assert cluster.security("127.0.0.1", False, False, False, False) == (False, False)
    assert cluster.security("127.0.0.1", True, False, False, False) == (True, False)
    assert cluster.security("localhost", False, True, False, False) == (True, True)
    assert capsys.readouterr().err == ""
    for host in ("10.77.0.1", "0.0.0.0", "server.lan", "::"):
        assert cluster.security(host, False, False, False, False) == (True, True)
    assert capsys.readouterr().err == ""
    assert cluster.security("10.77.0.1", False, False, False, True) == (True, False)
    assert "warning: --no-auth" in capsys.readouterr().err
    assert cluster.security("10.77.0.1", False, False, True, False) == (False, False)
    assert "warning: --insecure" in capsys.readouterr().err
    assert cluster.is_loopback("::1") and not cluster.is_loopback("10.0.0.1") and not cluster.is_loopback("0.0.0.0")


def test_server_certificate_names_the_address_and_keeps_its_ca(tmp_path):
    from cryptography import x509

    def sans(d):
        cert = x509.load_pem_x509_certificate((d / "server.pem").read_bytes())
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return cert, {str(v) for v in ext.get_values_for_type(x509.IPAddress)} | set(ext.get_values_for_type(x509.DNSName))

    d = cluster.certificates(tmp_path, ["10.77.0.1", "server.lan"])
    cert, names = sans(d)
    assert names == {"10.77.0.1", "server.lan", "127.0.0.1", "::1", "localhost"}
    ca = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    assert (d / "server.key").stat().st_mode & 0o077 == 0 and (d / "ca.key").stat().st_mode & 0o077 == 0
    before = (d / "server.pem").read_bytes()
    cluster.certificates(tmp_path, ["10.77.0.1"])  # already named: kept
    assert (d / "server.pem").read_bytes() == before
    cluster.certificates(tmp_path, ["0.0.0.0", "10.0.0.9"])  # a new name: re-issued by the same CA; a wildcard is no name
    cert, names = sans(d)
    assert "10.0.0.9" in names and "0.0.0.0" not in names
    cert.verify_directly_issued_by(ca)
    assert x509.load_pem_x509_certificate((d / "ca.crt").read_bytes()) == ca
    (d / "ca.key").unlink()  # certificates of your own CA: used when they name the address, never replaced
    assert cluster.certificates(tmp_path, ["10.0.0.9"]) == d
    with pytest.raises(cluster.ArgError, match=r"does not name .*10\.0\.0\.10.*no ca\.key"):
        cluster.certificates(tmp_path, ["10.0.0.10"])
    assert x509.load_pem_x509_certificate((d / "ca.crt").read_bytes()) == ca


def test_connect_address():
    assert launch.connect_address("0.0.0.0", 8000) == "127.0.0.1:8000"
    assert launch.connect_address("::", 8000) == "[::1]:8000"
    assert launch.connect_address("10.77.0.1", 9) == "10.77.0.1:9"
    assert launch.connect_address("fd00::5", 9) == "[fd00::5]:9"


def test_node_profile_owns_data_path_and_the_device_profile():
    """NodeProfile: the one reader of a node's data-path and declared device keys (checked as the schema says)."""
    from hetfl.common.nodeconfig import NodeConfigError, NodeProfile

    device_class, capacity = NODE_SCHEMA["device-class"], NODE_SCHEMA["capacity"]
    own = NodeProfile({"data-path": "/data/dev1", "device-class": "lpc", "capacity": "weak"})
    assert own.own_data and own.data_path == "/data/dev1"
    assert own.device(device_class) == "lpc" and own.device(capacity) == "weak"
    part = NodeProfile({"partition-id": 3, "num-partitions": 10})
    assert not part.own_data and part.data_path is None and part.device(device_class) is None
    with pytest.raises(NodeConfigError, match="device-class"):
        NodeProfile({"device-class": "fast"}).device(device_class)
