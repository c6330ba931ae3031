"""Hosts made as Linux network namespaces on this machine, for the tests of several hosts (tests/test_multihost.py,
tests/test_ray_cluster.py).

Each host is a namespace with one address (eth0, a /24) on a bridge that sits in a namespace of its own; no host has
a route anywhere else, so traffic stays among them. The namespaces share this machine's file system and process
table: only the network is per host. Everything is removed on exit, failure included.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PREFIX = "hfl"  # namespaces are named hfl<pytest pid>-...: a later run removes those whose process is gone


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def can_make_namespaces() -> str | None:
    """None if this process can create network namespaces, else why not."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None if made.returncode == 0 else f"ip netns add failed: {made.stderr.strip()}"


def require_namespaces() -> None:
    """Skip the calling test, with the reason, where network namespaces cannot be made."""
    import pytest

    why = can_make_namespaces()
    if why:
        pytest.skip(f"no network namespaces here: {why}")


def ns_pids(ns: str) -> list[int]:
    """Processes in network namespace `ns`."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def kill_all_in(ns: str) -> None:
    """SIGKILL every process in namespace `ns` (and only those)."""
    for pid in ns_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def remove_stale_namespaces() -> None:
    """Namespaces of an earlier run of these tests whose pytest process is gone (killed before its cleanup ran)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name, pid in re.findall(rf"^({PREFIX}(\d+)-[\w-]+)", listed, re.M):
        if not Path(f"/proc/{pid}").exists():
            kill_all_in(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def routes(ns: str) -> list[str]:
    """The routing table of namespace `ns`, one line per route."""
    return subprocess.run(["ip", "-n", ns, "route"], capture_output=True, text=True).stdout.splitlines()


@contextlib.contextmanager
def network(tag: str, hosts: dict[str, str]) -> Iterator[dict[str, str]]:
    """Host -> namespace: each with eth0 at its `hosts` address (/24) on a bridge in namespace `<tag>-sw`.

    `tag` must start with ``hfl<this process's pid>`` (:func:`remove_stale_namespaces`). On exit (failure
    included): SIGKILL any process still in a namespace, then delete the namespaces (their veths and the bridge go
    with them).
    """
    remove_stale_namespaces()
    names = {h: f"{tag}-{h}" for h in hosts}
    made: list[str] = []
    try:
        switch = f"{tag}-sw"
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for k, (host, ns) in enumerate(names.items()):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", switch, "link", "add", f"p{k}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", switch, "link", "set", f"p{k}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{hosts[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield names
    finally:
        for ns in made:
            kill_all_in(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
