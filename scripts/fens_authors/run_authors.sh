#!/bin/bash
# Run the FENS authors' pipeline (sacs-epfl/fens @ a349903, ported in this tree) on the hetfl project's exported
# Fashion-MNIST split: local training of every client -> INT8 logits -> FedAdam training of the NN aggregator,
# plus their static aggregators (run inside local training), and collect their numbers into one JSON file.
#
#   ./run_authors.sh <alpha> [--smoke] [--diff-init] [--out DIR]
#
#   <alpha>      0.1 or 0.01: reads export-dir<alpha>/ (python -m hetfl.export configs/fens/fmnist-dir<alpha>.toml)
#   --smoke      tiny run: the fewest export clients that together hold every class (alpha 0.1: 2, alpha 0.01: 6),
#                each cut to <= 40 rows per class (tools/smoke_data.py), 1 local epoch capped at 20 steps, 10 aggregator
#                rounds; full server test split. Only checks that the pipeline runs end to end.
#   --diff-init  every client starts from its own random model (the authors' scripts); default: one common initial
#                model, as hetfl's preset (fens-diff-init = false)
#   --out DIR    run directory (default runs/alpha<alpha>[-smoke])
# Output: <run-dir>/results.json (tools/collect_results.py), logs under <run-dir>/logs, timing in <run-dir>/timing.txt
#
# CPU only, 1 thread per client process (their --procs_per_machine -1 / size), all processes under `nice -n 19`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$ROOT/../.." && pwd)"                # the hetfl checkout this script lives in
PY="${PY:-$REPO/.venv/bin/python}"          # torch 2.14 CPU, torchvision, scikit-learn (their requirements)
export PYTHONPATH="$ROOT/shim"                   # no-op `wandb` (they run it disabled)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONWARNINGS="ignore"
NICE="nice -n 19"

ALPHA="${1:?usage: run_authors.sh <alpha> [--smoke] [--diff-init] [--out DIR]}"; shift
SMOKE=0; DIFF_INIT=""; OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --diff-init) DIFF_INIT="--diff_init" ;;
    --out) OUT="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

EXPORT="$ROOT/export-dir$ALPHA"
[ -f "$EXPORT/manifest.json" ] || { echo "missing $EXPORT; run: cd $REPO && FLWR_HOME=\$PWD/.flwr HF_HUB_OFFLINE=1 nice -n 19 .venv/bin/python -m hetfl.export configs/fens/fmnist-dir$ALPHA.toml --out $EXPORT" >&2; exit 1; }
DATA="$EXPORT/npz"
if [ ! -f "$DATA/server_test.npz" ]; then    # HF `datasets` is read outside their tree (their datasets/ shadows it)
  (cd /tmp && HF_HUB_OFFLINE=1 $NICE "$PY" "$ROOT/tools/export_to_npz.py" "$EXPORT" "$DATA")
fi

# ---- settings: hetfl configs/fens/fmnist-dir<alpha>.toml where their scripts take them as arguments -------------
SEED=0                 # hetfl run seed (their --seed: init, 90/10 proxy split, client order, shuffles)
PROXY=0.1              # fens-local-fraction 0.9
LR=0.01; BS=16         # lr, batch-size
LE=5                   # local-epochs; --use_scheduler: cosine per epoch, T_max = LE, eta_min 1e-3 (lr-min)
AGG_CLR=1.0            # fens-agg-client-lr
AGG_SLR=0.001          # fens-agg-server-lr
AGG_BS=128             # fens-agg-batch-size
AGG_STEPS=1            # fens-agg-local-steps
ROUNDS=500             # num-server-rounds
GMF=0.9                # FedAdam beta1 (beta2 0.99, tau 1e-3 are fixed in distoptim/FedAdam.py)
D=2                    # SmallNN hidden = d x clients = 40 (fens-aggregator-hidden 0 = 2M)
SIZE=20; MAXITR=0; EVALAFTER=5; TEST_BS=16; LOGIT_BS=64     # TEST_BS, LOGIT_BS: their scripts' values
RUN="${OUT:-$ROOT/runs/alpha$ALPHA$(if [ "$SMOKE" = 1 ]; then echo -smoke; fi)}"
mkdir -p "$RUN/logs" "$RUN/local_training" "$RUN/logits" "$RUN/aggregator"
if [ "$SMOKE" = 1 ]; then   # fewest export clients that hold every class, <= 40 rows per class each (tools/smoke_data.py)
  SIZE=$($NICE "$PY" "$ROOT/tools/smoke_data.py" "$EXPORT" "$RUN/smoke-data" 40 5)
  DATA="$RUN/smoke-data"; LE=1; MAXITR=20; ROUNDS=10
  echo "smoke: export clients $(cat "$DATA/smoke.json")"
fi
: > "$RUN/timing.txt"
LNAME="FMNIST_localSGD_${ALPHA}_${SEED}_${PROXY}"
ANAME="FMNIST_fedadam_${ALPHA}_${SEED}"
LOGITS="$RUN/logits/FMNIST_${ALPHA}_${SEED}_${PROXY}"
mkdir -p "$LOGITS"
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cd "$ROOT"   # their scripts import their own packages (datasets/, models/, distoptim/) from the repository root

stage() {   # stage <name> <function>: run, append "name wall user sys" to timing.txt
  local name="$1"; shift
  local TIMEFORMAT="$name %R %U %S"
  echo "==> $name ($(date +%T))"
  { time "$@" ; } 2>> "$RUN/timing.txt"
}

local_training() {   # scripts/local_training.sh, one process per client, gloo on localhost
  local port; port=$(free_port)
  local pids=()
  for rank in $(seq 0 $((SIZE-1))); do
    $NICE "$PY" train_LocalSGD.py --lr $LR --slr 1.0 --bs $BS --alpha $ALPHA --mu 0.0 \
      --lowE $LE --highE $LE -iE --use_scheduler --max_itr $MAXITR \
      --momentum 0.0 --gmf 0.0 \
      --numclients $SIZE --rank $rank --size $SIZE --totalclients $SIZE \
      --backend gloo --initmethod tcp://127.0.0.1:$port \
      --weights data_based $DIFF_INIT \
      --rounds 1 --seed $SEED --NIID --print_freq 100 \
      --save -p --name $LNAME --disable_wandb \
      --dataset FMNIST --optimizer localSGD --model QCNN \
      --savepath "$RUN/local_training" --evalafter 5 --test_bs $TEST_BS \
      --datapath "$DATA" \
      --proxy_set --proxy_ratio $PROXY \
      --val_set --val_ratio 0.5 -sm --procs_per_machine -1 \
      > "$RUN/logs/local_r$rank.out" 2>&1 &
    pids+=($!)
  done
  local rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

logits() {   # scripts/generate_logit.sh
  $NICE "$PY" generate_logits_v2.py --model QCNN --dataset FMNIST --datapath "$DATA" \
    --modelpath "$RUN/local_training/$LNAME" --save_dir "$LOGITS" \
    --alpha $ALPHA --seed $SEED --proxy_ratio $PROXY --batch_size $LOGIT_BS \
    --generate_local_testset --generate_valset > "$RUN/logs/logits.out" 2>&1
}

aggregator() {   # scripts/train_aggregator.sh (FedAdam on SmallNN, every client every round)
  local port; port=$(free_port)
  local pids=()
  for rank in $(seq 0 $((SIZE-1))); do
    $NICE "$PY" train_LocalSGD.py --lr $AGG_CLR --slr $AGG_SLR --bs $AGG_BS --alpha $ALPHA --mu 0.0 \
      --lowE $AGG_STEPS --highE $AGG_STEPS \
      --momentum 0.0 --gmf $GMF --d $D \
      --numclients $SIZE --rank $rank --size $SIZE --totalclients $SIZE \
      --backend gloo --initmethod tcp://127.0.0.1:$port \
      --weights data_based --disable_wandb \
      --rounds $ROUNDS --seed $SEED --NIID --print_freq 50 \
      --save -p --name $ANAME \
      --dataset CIFAR10QAgg --optimizer fedadam --model SmallNN \
      --savepath "$RUN/aggregator" --evalafter $EVALAFTER \
      --datapath "$DATA" \
      --proxy_set --proxy_ratio $PROXY --val_set \
      --logitpath "$LOGITS" -sm \
      --procs_per_machine $SIZE \
      > "$RUN/logs/agg_r$rank.out" 2>&1 &
    pids+=($!)
  done
  local rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

stage local_training local_training
stage logits logits
stage aggregator aggregator
$NICE "$PY" tools/collect_results.py --run-dir "$RUN" --local "$RUN/local_training/$LNAME" --logits "$LOGITS" \
  --agg "$RUN/aggregator/$ANAME" --size $SIZE --out "$RUN/results.json" \
  --meta upstream=sacs-epfl/fens@a349903d89d3aa284357a5f18b6118f5747b76ce alpha=$ALPHA smoke=$SMOKE seed=$SEED \
         clients=$SIZE local_epochs=$LE max_itr=$MAXITR lr=$LR bs=$BS diff_init=${DIFF_INIT:-no} \
         agg_rounds=$ROUNDS agg_clr=$AGG_CLR agg_slr=$AGG_SLR agg_bs=$AGG_BS agg_steps=$AGG_STEPS export="${EXPORT#$ROOT/}" data="${DATA#$ROOT/}"
echo "==> results: $RUN/results.json"
