"""Fleets from a real cluster (docs/fleets.md#from-a-cluster): hetfl fleet measure turns a deployment run's
measured devices into a fleet file, hetfl fleet check sets a fleet's simulated clock against a run's real round
times.

    hetfl fleet measure results/<run>/metrics.json -o fleets/my-cluster.toml
    hetfl fleet check fleets/my-cluster.toml results/<another run>/metrics.json

A measured fleet has one tier per client of the run, named ``client-<id>``, share 1:

* ``flops-per-s``: the FLOPs the client's replies reported over the training seconds they reported, summed over
  the run's rounds (its sustained speed while it really trained); where it never trained, what it measured at
  discovery (``measure-devices``);
* ``down-mbps`` = ``up-mbps``: the bytes it moved (down and up) over its communication time, the seconds from
  sending its message to the pull that saw its reply less its reported training seconds. That time also holds the
  ClientApp's start on the device, (de)serialisation and Flower's polling (every 3 s on a SuperLink), so this is the
  device's effective link as the run saw it, not its radio's rate; one figure for both directions (the two are not
  told apart);
* ``device-class``: the class the run assigned (SHEFL with measured devices), else the faster half are ``hpc``;
* ``capacity``: the parameters it could afford (AdaptiveFL under a round budget), else a tier by speed rank spread
  over ``weak``, ``medium``, ``strong`` (the slowest ``weak``, the fastest ``strong``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hetfl.common.fleet import CAPACITY_TIERS, FleetError, load_fleet, simulated_round_seconds


def _rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in metrics.get("rounds", []) if r.get("round", 0) > 0]


def observed(metrics: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Per client of a run: FLOPs, training seconds, bytes and communication seconds summed over its rounds."""
    out: dict[int, dict[str, float]] = {}
    for r in _rows(metrics):
        reply, train = r.get("reply_s_by_client", {}), r.get("train_s_by_client", {})
        for c in reply:
            o = out.setdefault(int(c), {"flops": 0.0, "train_s": 0.0, "bytes": 0.0, "comm_s": 0.0})
            o["flops"] += float(r.get("flops_by_client", {}).get(c, 0))
            o["train_s"] += float(train.get(c, 0.0))
            o["bytes"] += float(r.get("bytes_down_by_client", {}).get(c, 0)) + float(r.get("bytes_up_by_client", {}).get(c, 0))
            o["comm_s"] += max(0.0, float(reply[c]) - float(train.get(c, 0.0)))
    return out


def measured_fleet(metrics: dict[str, Any], name: str = "measured") -> str:
    """The fleet file (TOML text) of a run's devices (module docstring); ValueError where the run measured none."""
    devices = {int(c): d for c, d in metrics.get("measured_devices", {}).items()}
    seen = observed(metrics)
    clients = sorted(set(devices) | set(seen))
    if not clients:
        raise ValueError("the run holds neither measured devices (measure-devices = true) nor per-client reply times; "
                         "expected the metrics.json of a deployment run with measure-devices = true")
    speed = {c: (seen[c]["flops"] / seen[c]["train_s"]) if c in seen and seen[c]["train_s"] > 0 and seen[c]["flops"] > 0
             else float(devices.get(c, {}).get("flops-per-s", 0.0)) for c in clients}
    if any(v <= 0 for v in speed.values()):
        missing = [c for c, v in speed.items() if v <= 0]
        raise ValueError(f"client(s) {missing} neither trained nor measured themselves; expected measure-devices = true")
    mbps = {c: (8 * seen[c]["bytes"] / seen[c]["comm_s"] / 1e6) if c in seen and seen[c]["comm_s"] > 0 else None
            for c in clients}
    roles = metrics.get("roles", {}).get("measured", {})
    caps = {}
    for r in _rows(metrics):
        caps.update({int(c): v for c, v in r.get("capacity_by_client", {}).items()})
    ranked = sorted(clients, key=lambda c: (speed[c], c))
    lines = [f'name = "{name}"',
             f'source = "measured on a real cluster: run {metrics.get("config", {}).get("run-name", "")!s}, '
             f'{len(_rows(metrics))} round(s); hetfl fleet measure"', ""]
    for c in clients:
        rank = ranked.index(c)
        cls = roles.get(str(c)) or ("hpc" if rank >= len(clients) / 2 else "lpc")
        cap = caps.get(c) or CAPACITY_TIERS[round(2 * rank / (len(clients) - 1)) if len(clients) > 1 else 2]
        link = mbps[c] if mbps[c] is not None else 1000.0  # never communicated in a round: no link limit known
        lines += ["[[tier]]", f'name = "client-{c}"', "share = 1", f'device-class = "{cls}"',
                  f"capacity = {cap!r}" if isinstance(cap, float) else f'capacity = "{cap}"',
                  f"flops-per-s = {speed[c]:.6g}", f"down-mbps = {link:.6g}", f"up-mbps = {link:.6g}", ""]
    return "\n".join(lines)


def check(fleet_path: str | Path, metrics: dict[str, Any]) -> list[dict[str, float]]:
    """Per round of a run: its real synchronous round (``comm_s``: the server's wait for the round's replies) and
    the fleet's simulated clock of the same round (FedScale's model on the round's recorded bytes and FLOPs, client
    c on tier ``client-<c>``)."""
    fleet = load_fleet(fleet_path)
    by_name = {t.name: t for t in fleet.tiers}
    out = []
    for r in _rows(metrics):
        # every client the round heard from or sent to, each on its own measured tier (none stands in for another)
        clients = sorted({int(c) for key in ("reply_s_by_client", "bytes_down_by_client", "bytes_up_by_client",
                                              "flops_by_client") for c in r.get(key, {})})
        missing = [c for c in clients if f"client-{c}" not in by_name]
        if missing:
            raise FleetError(f"{fleet_path}: no tier 'client-{missing[0]}' for client {missing[0]} of round {r['round']}; "
                             "expected a fleet written by hetfl fleet measure from the same cluster")
        tiers = [by_name[f"client-{c}"] if c in clients else None for c in range(max(clients) + 1)] if clients else []
        sim = simulated_round_seconds(tiers, r.get("bytes_down_by_client", {}), r.get("bytes_up_by_client", {}),
                                      r.get("flops_by_client", {}))
        out.append({"round": r["round"], "real_s": float(r["comm_s"]), "simulated_s": sim})
    return out


def main(argv: list[str] | None = None, prog: str = "hetfl fleet") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="write the fleet file of a run's measured devices")
    m.add_argument("metrics", help="a deployment run's metrics.json (run with measure-devices = true)")
    m.add_argument("-o", "--out", required=True, help="the fleet file to write (TOML)")
    m.add_argument("--name", default="", help="the fleet's name (default: the file's stem)")
    c = sub.add_parser("check", help="a fleet's simulated clock against a run's real round times")
    c.add_argument("fleet", help="a fleet file (hetfl fleet measure)")
    c.add_argument("metrics", help="the metrics.json of a run on the same cluster")
    a = p.parse_args(argv)
    try:
        metrics = json.loads(Path(a.metrics).read_text())
        if a.command == "measure":
            out = Path(a.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(measured_fleet(metrics, a.name or out.stem))
            load_fleet(out)  # what hetfl compare will read
            print(f"{out}: {len(load_fleet(out).tiers)} measured tier(s)")
            return 0
        rows = check(a.fleet, metrics)
    except (OSError, json.JSONDecodeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("round  real s  simulated s  error")
    for r in rows:
        err = (r["simulated_s"] - r["real_s"]) / r["real_s"] if r["real_s"] else float("nan")
        print(f"{r['round']:5d}  {r['real_s']:6.2f}  {r['simulated_s']:11.2f}  {100 * err:+6.1f}%")
    if rows:
        mean_abs = sum(abs(r["simulated_s"] - r["real_s"]) / r["real_s"] for r in rows if r["real_s"]) / len(rows)
        print(f"mean absolute error {100 * mean_abs:.1f}% over {len(rows)} round(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
