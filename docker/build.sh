#!/usr/bin/env bash
# Build the project image hetfl:latest without any registry (docs/deployment.md, "Docker Compose"):
#   1. hetfl-base:bookworm from debootstrap + docker import (docker/build-base.sh; skipped when the image exists);
#   2. the wheelhouse docker/.cache/wheels: `pip download` on the host of the exact versions pinned in pyproject.toml
#      for the image's Python (CPython 3.11, manylinux x86_64), through the host's pip configuration (its index or
#      mirrors); skipped while pyproject.toml's dependencies are those it was made for;
#   3. `docker build` of docker/Dockerfile with BuildKit (the wheels are bind-mounted, not copied into the image;
#      Docker's layer cache makes a rebuild with unchanged pins and sources a no-op).
# Usage: bash docker/build.sh        (root; a running Docker engine; host python3 >= 3.11 with pip, or python3-venv)
# Environment: HETFL_IMAGE (default hetfl:latest), DOCKER, DEBIAN_MIRROR, REBUILD=1 (base image and wheelhouse again).
# Note: PyPI's torch wheel for Linux is the CUDA build: the wheelhouse is ~3.2 GB and the image ~6 GB (torch with its
# nvidia-* libraries); there is no CPU-only torch 2.14.1 on PyPI.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
IMAGE="${HETFL_IMAGE:-hetfl:latest}"
DOCKER="${DOCKER:-$( [ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker )}"
export DOCKER
WHEELS=docker/.cache/wheels
say() { printf 'build [%4ss]: %s\n' "$SECONDS" "$*"; }

bash docker/build-base.sh

# The image's pip installs exactly these (plus the project's build backend) from $WHEELS, with --no-index.
req="$(python3 - <<'PY'
import sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(p["project"]["dependencies"] + [r for r in p["build-system"]["requires"]]))
PY
)" || { echo "build: error: host python3 >= 3.11 needed to read pyproject.toml" >&2; exit 2; }
if [ "${REBUILD:-0}" != 1 ] && [ -f "$WHEELS/requirements.txt" ] && [ "$(cat "$WHEELS/requirements.txt")" = "$req" ]; then
  say "wheelhouse $WHEELS is up to date with pyproject.toml ($(ls "$WHEELS"/*.whl | wc -l) wheels)"
else
  pip=(python3 -m pip)
  if ! python3 -m pip --version >/dev/null 2>&1; then   # e.g. Debian's python3 without python3-pip
    python3 -m venv docker/.cache/pip-venv >/dev/null || { echo "build: error: no pip for python3; apt-get install python3-venv" >&2; exit 2; }
    pip=(docker/.cache/pip-venv/bin/python -m pip)
  fi
  plat=()
  for v in $(seq 36 -1 17); do plat+=(--platform "manylinux_2_${v}_x86_64"); done   # Debian 12 has glibc 2.36
  plat+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64)
  rm -f "$WHEELS/requirements.txt"
  mkdir -p "$WHEELS"
  say "pip download of the pinned dependencies into $WHEELS (about 3.2 GB with torch's CUDA libraries; minutes)"
  printf '%s\n' "$req" > docker/.cache/requirements.in
  "${pip[@]}" download -q --disable-pip-version-check -d "$WHEELS" --only-binary=:all: \
      --python-version 3.11 --implementation cp --abi cp311 "${plat[@]}" -r docker/.cache/requirements.in \
    || { echo "build: error: pip download failed (output above)" >&2; exit 1; }
  printf '%s\n' "$req" > "$WHEELS/requirements.txt"
  say "wheelhouse ready: $(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)"
fi

say "docker build -f docker/Dockerfile -t $IMAGE . (BuildKit)"
DOCKER_BUILDKIT=1 "$DOCKER" build -q -f docker/Dockerfile -t "$IMAGE" . >/dev/null \
  || { echo "build: error: docker build failed; run 'DOCKER_BUILDKIT=1 $DOCKER build -f docker/Dockerfile -t $IMAGE .' for its output" >&2; exit 1; }
say "image $IMAGE ready ($("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f GB", $1/1e9}'))"
