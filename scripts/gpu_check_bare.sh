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
mkdir -p "$OUT" /tmp/site /usr/share/datasets/fashion-mnist
PY=$(command -v python3)
t0=$(date +%s)
for f in .gpu/site*.tar.xz; do xz -dc -T0 "$f" | tar xf - -C /tmp/site || exit 2; done
xz -dc -T0 .gpu/fm.tar.xz | tar xf - -C /usr/share/datasets/fashion-mnist || exit 2
# console scripts (flwr, flower-superlink, flower-supernode, flwr-clientapp, ...) from the unpacked entry points
mkdir -p /tmp/site/bin
"$PY" - "$PY" <<'EOF'
import configparser, glob, os, sys
py = sys.argv[1]
for ep in glob.glob("/tmp/site/*.dist-info/entry_points.txt"):
    cp = configparser.ConfigParser(delimiters=("=",)); cp.optionxform = str; cp.read(ep)
    for name, target in (cp["console_scripts"].items() if cp.has_section("console_scripts") else []):
        mod, _, attr = target.strip().partition(":")
        path = f"/tmp/site/bin/{name}"
        with open(path, "w") as f:
            f.write(f"#!{py}\nimport functools, sys\nimport {mod} as m\n"
                    f"sys.exit(functools.reduce(getattr, {attr.split('.')!r}, m)())\n")
        os.chmod(path, 0o755)
EOF
export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export FLWR_HOME=$PWD/.flwr FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_DISABLE_UPDATE_CHECK=1 HF_HUB_OFFLINE=1
echo "setup: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, flwr, ray, datasets, flwr_datasets; print('python', __import__('platform').python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), 'flwr', flwr.__version__ if hasattr(flwr, '__version__') else '?', 'ray', ray.__version__, 'datasets', datasets.__version__)"
timeout "${GPU_CHECK_LIMIT:-480}" "$PY" scripts/gpu_check.py 2>&1 | tee "$OUT/gpu_check.log" | grep -v "still running"
rc=${PIPESTATUS[0]}
cp docs/results/gpu-check-*.md "$OUT/" 2>/dev/null
for m in results/gpu-check/*/metrics.json; do [ -f "$m" ] && cp "$m" "$OUT/$(basename "$(dirname "$m")").metrics.json"; done
echo "gpu-check rc $rc; total $(( $(date +%s) - t0 )) s"
exit "$rc"
