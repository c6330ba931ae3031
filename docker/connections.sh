#!/usr/bin/env bash
# Add the compose cluster's SuperLink connections to $FLWR_HOME/config.toml (default: ./.flwr):
#   docker-local      insecure, 127.0.0.1:$HETFL_PORT (default 8000, the port docker/compose.yml publishes)
#   docker-local-tls  TLS with docker/certs/out/ca.crt (compose.tls.yml, compose.auth.yml)
# (The `cli` service of docker/compose.yml has its own connections: docker/flwr-config.toml.)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HOME_DIR="${FLWR_HOME:-$ROOT/.flwr}"
PORT="${HETFL_PORT:-8000}"
mkdir -p "$HOME_DIR"
CFG="$HOME_DIR/config.toml"
touch "$CFG"
grep -q '^\[superlink\]' "$CFG" || printf '[superlink]\ndefault = "docker-local"\n\n' >> "$CFG"
grep -q '^\[superlink.docker-local\]' "$CFG" || printf '[superlink.docker-local]\naddress = "127.0.0.1:%s"\ninsecure = true\n\n' "$PORT" >> "$CFG"
grep -q '^\[superlink.docker-local-tls\]' "$CFG" || \
  printf '[superlink.docker-local-tls]\naddress = "127.0.0.1:%s"\nroot-certificates = "%s"\n\n' "$PORT" "$ROOT/docker/certs/out/ca.crt" >> "$CFG"
echo "connections docker-local, docker-local-tls in $CFG"
