#!/usr/bin/env bash
# One ECDSA P-384 key pair per SuperNode for SuperNode authentication (docker/compose.auth.yml).
# Usage: docker/keys/generate.sh [N=4]; register each public key with
#   flwr supernode register docker/keys/supernode-<i>.pub <connection>
set -euo pipefail
N="${1:-4}"
cd "$(dirname "$0")"
for i in $(seq 0 $((N - 1))); do
  [ -f "supernode-$i" ] || ssh-keygen -q -t ecdsa -b 384 -N "" -C "hetfl-supernode-$i" -f "supernode-$i"
done
echo "keys in $(pwd): supernode-<i> (private, mount into the SuperNode), supernode-<i>.pub (register)"
