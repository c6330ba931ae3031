#!/usr/bin/env bash
# The declared studies' long runs (docs/verdicts.md) on a bare lent GPU machine (docs/gpu.md), one process per
# (study, method) at once, for at most $DEADLINE seconds; then every run is stopped and what it finished comes back
# to continue on the CPU here, where `hetfl study run <file>` resumes it (each method's tuning study and scored runs
# live in docs/results/studies/<study>/<method>/, so two machines working on different methods do not meet).
# JOBS="<study>:<method> ..." picks the pairs (default below; the SHEFL study's own method runs on the CPU here).
# Expects .gpu/ (WITHOUT_RAY=1 bash scripts/gpu_payload.sh) and .gpuin/ (the state the runs resume that the tree sent
# there lacks: ignored checkpoints and an unfinished study's trials, at their repository paths: `bash
# scripts/gpu_long_runs.sh --prepare` here). A later call continues what an earlier one stopped.
# Writes to $OUT: runs.tar.xz.* (the runs' metrics, study files and latest checkpoints, split in 15 MiB parts;
# here: cat runs.tar.xz.* | xz -dc | tar xf - -C <this checkout>) and the logs' tails on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-"shefl-table1:fedensemble shefl-table1:fedavg adaptivefl-table2:adaptivefl adaptivefl-table2:all-large
adaptivefl-table2:heterofl fens-iterative-dir0.01:fedadam fens-iterative-dir0.01:fedavg fens-dir0.05:fens"}
ROOTS=""
for j in $JOBS; do ROOTS="$ROOTS docs/results/studies/${j%%:*}/${j#*:}"; done
pack() {  # pack <tar> <roots...>: the runs' metrics, study files and latest checkpoint (no TensorBoard, plots, models)
  "$PY" - "$@" <<'PYEOF'
import json, sys, tarfile
from pathlib import Path
with tarfile.open(sys.argv[1], "w") as t:
    for root in map(Path, sys.argv[2:]):
        for f in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            if "tensorboard" in f.parts or f.suffix == ".png" or f.name.startswith(("final_model", "checkpoint-r")):
                continue
            t.add(f)
            if f.name == "checkpoint.json":  # the checkpoint's tensors: the latest file only
                t.add(f.parent / json.loads(f.read_text())["tensors"]["file"])
print("packed", Path(sys.argv[1]).stat().st_size // 2**20, "MiB")
PYEOF
}
if [ "${1:-}" = --prepare ]; then  # here: what the runs read that the tree sent there lacks (the state they resume)
  PY=${PY:-.venv/bin/python}
  rm -rf .gpuin && mkdir -p .gpuin
  roots=()
  for r in $ROOTS; do [ -e "$r" ] && roots+=("$r"); done
  [ ${#roots[@]} = 0 ] && { echo "nothing to carry: no job has started"; mkdir -p .gpuin; exit 0; }
  pack /tmp/gpuin.tar "${roots[@]}" && tar xf /tmp/gpuin.tar -C .gpuin && rm /tmp/gpuin.tar
  du -sh .gpuin; exit 0
fi
OUT=${OUT:-$PWD/gpu-out}
DEADLINE=${DEADLINE:-470}
mkdir -p "$OUT" results/gpu-logs
t0=$(date +%s)
if [ "${SKIP_SETUP:-0}" = 1 ]; then PY=${PY:-python3}; else source scripts/gpu_setup.sh; fi  # SKIP_SETUP=1 PY=...: a dry run here
cp -r .gpuin/. .
export OMP_NUM_THREADS=1
"$PY" -c "import torch, optuna; print('python', __import__('platform').python_version(), 'torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA', 'optuna', optuna.__version__)"
echo "setup: $(( $(date +%s) - t0 )) s"
jobs_=()
for j in $JOBS; do jobs_+=("${j%%:*}-${j#*:}|-m hetfl.study run experiments/${j%%:*}.toml --methods ${j#*:}"); done
set -m  # each run in its own process group, SIGINT not ignored (a non-interactive shell ignores it in background jobs)
pids=()
for j in "${jobs_[@]}"; do
  name=${j%%|*}; args=${j#*|}
  "$PY" $args >"results/gpu-logs/$name.log" 2>&1 &
  pids+=($!)
done
while :; do
  alive=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  [ $(( $(date +%s) - t0 )) -ge "$DEADLINE" ] && break
  sleep 5
done
echo "stopping at $(( $(date +%s) - t0 )) s"
for p in "${pids[@]}"; do kill -INT -- "-$p" 2>/dev/null; done
sleep 20
for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
for j in "${jobs_[@]}"; do name=${j%%|*}; [ -f "results/gpu-logs/$name.log" ] || continue; echo "== $name"; grep -v "still running" "results/gpu-logs/$name.log" | tail -n 12; done
roots=(); for r in $ROOTS; do [ -e "$r" ] && roots+=("$r"); done
pack /tmp/runs.tar "${roots[@]}" results/gpu-logs
xz -T0 -1 -c /tmp/runs.tar | split -b 15M - "$OUT/runs.tar.xz."
ls -l "$OUT"
echo "total $(( $(date +%s) - t0 )) s"
