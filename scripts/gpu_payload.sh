#!/usr/bin/env bash
# Build .gpu/ for scripts/gpu_check_bare.sh: what `make install data` would fetch, packed for a GPU machine that
# reaches no registry and brings its own Python (3.12) and PyTorch (docs/gpu.md). Run here, where pip reaches PyPI.
#   site.tar.xz  the dependencies that machine's image lacks, the versions of this project's .venv, as unpacked
#                cp312 wheels; ray without its Java jars, dashboard build and the libraries hetfl never imports
#                (data, serve, tune, train, llm, workflow, rllib), binaries stripped: ~37 MB
#   fm.tar.xz    Fashion-MNIST's four IDX files, uncompressed and xz'd: ~26 MB
# Both must fit the lent machine's 64 MiB with the tracked tree (docs/gpu.md says how).
# WITHOUT_RAY=1 leaves ray out (~25 MB less): enough for the in-process engine (hetfl.inprocess, hetfl.tune), which
# is what the long runs of scripts/gpu_long_runs.sh use; the Simulation Engine steps of gpu_check.py need ray.
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PY312:-3.12}
PKGS="flwr flwr-datasets datasets ray alembic cryptography fastapi grpcio grpcio-health-checking iterators
prompt-toolkit pycryptodome sqlalchemy tomli tomli-w starlette uvicorn pydantic pydantic-core annotated-types
typing-inspection dill multiprocess jsonschema jsonschema-specifications referencing rpds-py tensorboardX protobuf
wcwidth mako greenlet cffi pycparser typer optuna colorlog"
[ "${WITHOUT_RAY:-0}" = 1 ] && PKGS=${PKGS/ ray / }
pins=""
for p in $PKGS; do pins="$pins $p==$(.venv/bin/pip show "$p" | awk '/^Version/{print $2}')"; done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY312" --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$work/whl" $pins
mkdir -p "$work/site" .gpu
for w in "$work"/whl/*.whl; do unzip -q -o "$w" -d "$work/site"; done
rm -rf "$work"/site/*.data "$work"/site/ray/{jars,dashboard/client/build,rllib,data,serve,tune,train,llm,workflow}
find "$work/site" -name "*.so*" -size +500k -exec strip --strip-unneeded {} \;
[ -d "$work/site/ray" ] && strip --strip-unneeded "$work/site/ray/core/src/ray/raylet/raylet" "$work/site/ray/core/src/ray/gcs/gcs_server"
find "$work/site" -name __pycache__ -prune -exec rm -rf {} \;
tar cf - -C "$work/site" . | xz -T0 -6 > .gpu/site.tar.xz
mkdir -p "$work/fm"
for f in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do zcat "$f" > "$work/fm/$(basename "$f" .gz)"; done
tar cf - -C "$work/fm" . | xz -T0 -9 > .gpu/fm.tar.xz
ls -l .gpu
