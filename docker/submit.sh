#!/usr/bin/env bash
# hetfl-submit: submit one run to the Compose cluster's SuperLink and wait for its end. It runs in the `cli` service
# of docker/compose.yml (docker/Dockerfile installs it as /usr/local/bin/hetfl-submit; docs/deployment.md, "Docker Compose").
# `flwr run --stream` exits 0 even when a run fails (Flower 1.41), so this asks the SuperLink for the run's status
# and exits 0 only when it is finished:completed.
#
# Usage: hetfl-submit [--check] PRESET [key=value ...]
#   Values are TOML, as in Flower's `flwr run --run-config`: numbers and booleans bare, strings in double quotes,
#   which the shell must pass through (single-quote the pair):
#     hetfl-submit configs/quickstart.toml num-server-rounds=2 lr=0.05 fraction-train=1.0 \
#         'run-name="my-run"' 'model="cnn"' drop-last=true
#   --check: print the merged run config after its checks and exit (0), without submitting.
# Environment: HETFL_CONNECTION (default docker; docker-tls with the TLS overlays), HETFL_APP (default /app).
set -euo pipefail
usage='usage: hetfl-submit [--check] PRESET [key=value ...]   (TOML values: strings quoted, e.g. '"'"'run-name="my-run"'"'"')'
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
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
if [ "$check" = 1 ]; then cat "$work/run.toml"; exit 0; fi

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
