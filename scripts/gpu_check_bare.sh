#!/usr/bin/env bash
# `make gpu-check` on a bare GPU machine that reaches no package registry and has its own Python and PyTorch
# (the lent machines of docs/gpu.md): unpack what `make install data` would have fetched, then run
# scripts/gpu_check.py with that machine's python3.
#
# Expects, in .gpu/ (made here, on a machine with the registries; see docs/gpu.md):
#   site*.tar.xz the project's dependencies that the GPU image lacks (flwr, flwr-datasets, datasets, ray, ...),
#                unpacked wheels for that image's Python, extracted to /tmp/site
#   fm.tar.xz    Fashion-MNIST's four IDX files (Debian's dataset-fashion-mnist), extracted where the catalog looks
# Writes the report (docs/results/gpu-check-<date>.md), the log and each run's metrics.json to $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
t0=$(date +%s)
source scripts/gpu_setup.sh
echo "setup: $(( $(date +%s) - t0 )) s"
"$PY" -c "import torch, flwr, ray, datasets, flwr_datasets; print('python', __import__('platform').python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'flwr', flwr.__version__ if hasattr(flwr, '__version__') else '?', 'ray', ray.__version__, 'datasets', datasets.__version__)"
timeout "${GPU_CHECK_LIMIT:-480}" "$PY" scripts/gpu_check.py 2>&1 | tee "$OUT/gpu_check.log" | grep -v "still running"
rc=${PIPESTATUS[0]}
cp docs/results/gpu-check-*.md "$OUT/" 2>/dev/null
for m in results/gpu-check/*/metrics.json; do [ -f "$m" ] && cp "$m" "$OUT/$(basename "$(dirname "$m")").metrics.json"; done
echo "gpu-check rc $rc; total $(( $(date +%s) - t0 )) s"
exit "$rc"
