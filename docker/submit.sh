#!/usr/bin/env bash
# hetfl-submit: submit one run to the Compose cluster's SuperLink and wait for its end. It runs in the `cli` service
# of docker/compose.yml (docker/Dockerfile installs it as /usr/local/bin/hetfl-submit; docs/deployment.md, "Docker Compose").
# `flwr run --stream` exits 0 even when a run fails (Flower 1.41), so this asks the SuperLink for the run's status
# and exits 0 only when it is finished:completed.
#
# Usage: hetfl-submit PRESET [key=value ...]
#   e.g. hetfl-submit configs/quickstart.toml num-server-rounds=2 min-available-nodes=4 fraction-train=1.0
# Environment: HETFL_CONNECTION (default docker; docker-tls with the TLS overlays), HETFL_APP (default /app).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: hetfl-submit PRESET [key=value ...]" >&2; exit 2; }
conn="${HETFL_CONNECTION:-docker}"
app="${HETFL_APP:-/app}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# One TOML file of preset + overrides (flwr takes a file or key=value pairs, not both), checked against the schema
# (hetfl.methods.SCHEMA) so that a bad key fails here in one line instead of inside the ServerApp.
python3 - "$work/run.toml" "$@" <<'PY'
import sys
from pathlib import Path

from hetfl.methods import validate
from hetfl.launch import config_errors, load_preset, parse_set, write_run_config

out, preset, *pairs = sys.argv[1:]
with config_errors():
    overrides = parse_set(pairs)
    validate({**load_preset(preset), **overrides})
    write_run_config(Path(out), preset, overrides)
PY

flwr run "$app" "$conn" --stream --run-config "$work/run.toml" 2>&1 | tee "$work/run.log"
run_id="$(grep -oE 'Successfully started run [0-9]+' "$work/run.log" | grep -oE '[0-9]+$' | tail -n 1 || true)"
[ -n "$run_id" ] || { echo "hetfl-submit: error: flwr run did not start a run (its output is above)" >&2; exit 1; }
flwr list "$conn" --run-id "$run_id" --format json > "$work/status.json" 2>&1 || true
if grep -q '"status": "finished:completed"' "$work/status.json"; then
  echo "hetfl-submit: run $run_id finished:completed"
else
  echo "hetfl-submit: error: run $run_id did not complete: $(grep -oE '"status(-details)?": "[^"]*"' "$work/status.json" | tr '\n' ' ')" >&2
  exit 1
fi
