#!/usr/bin/env bash
# Add the compose cluster's SuperLink connections to $FLWR_HOME/config.toml (default: ./.flwr):
#   docker-local      insecure, 127.0.0.1:8000   (docker/compose.yml)
#   docker-local-tls  TLS with docker/certs/out/ca.crt (compose.tls.yml, compose.auth.yml)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HOME_DIR="${FLWR_HOME:-$ROOT/.flwr}"
mkdir -p "$HOME_DIR"
CFG="$HOME_DIR/config.toml"
touch "$CFG"
grep -q '^\[superlink\]' "$CFG" || printf '[superlink]\ndefault = "docker-local"\n\n' >> "$CFG"
grep -q '^\[superlink.docker-local\]' "$CFG" || printf '[superlink.docker-local]\naddress = "127.0.0.1:8000"\ninsecure = true\n\n' >> "$CFG"
grep -q '^\[superlink.docker-local-tls\]' "$CFG" || \
  printf '[superlink.docker-local-tls]\naddress = "127.0.0.1:8000"\nroot-certificates = "%s"\n\n' "$ROOT/docker/certs/out/ca.crt" >> "$CFG"
echo "connections docker-local, docker-local-tls in $CFG"
