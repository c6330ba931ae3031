# hetfl: heterogeneous federated learning on Flower 1.41.
#   make run    short real FedAvg run on Fashion-MNIST (offline), prints accuracy and plot path
#   make quickstart-shefl | quickstart-fens | quickstart-adaptivefl   one short real run per method (< 2 min)
#   make test   the test suite (unit + end-to-end simulations + local SuperLink/SuperNode clusters)
#   make test-deploy  deployments on hosts the tests make (network namespaces, shaped links, cgroups; root)
#   make test-docker  Docker Compose cluster on a real Docker engine, 2 rounds to the end (root; installs what is missing)
#   make bench  simulated round vs plain PyTorch loop (light and paper regime), bf16 vs fp32, 10,000-SuperNode probe
#   make reproduce-shefl | reproduce-shefl-studies | calibrate-shefl | reproduce-fens | reproduce-fens-iterative
#               | reproduce-oneshot | reproduce-adaptivefl
#               the tables of docs/results/ from the runs committed there (seconds); TRAIN=1 trains what is
#               missing (hours to days on 2 CPU cores: each target says how long before it starts)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# flwr must not build per-run environments (uv cannot see the local torch mirror) and
# keeps its state inside the project.
export FLWR_HOME := $(CURDIR)/.flwr
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export FLWR_DISABLE_UPDATE_CHECK := 1
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: install data compose-cli run test test-deploy test-fast docs test-docker bench gpu-check clean cluster reproduce-shefl reproduce-shefl-studies calibrate-shefl reproduce-fens reproduce-fens-iterative reproduce-oneshot reproduce-adaptivefl quickstart-shefl quickstart-fens quickstart-adaptivefl quickstart-tabular verdicts

install: $(STAMP)
$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

# Real Fashion-MNIST from Debian (full IDX files) where apt-get and root exist; elsewhere the runs read it from the
# Hugging Face hub (the quickstarts' data-source = "auto"), so this never fails.
APT_GET ?= apt-get
data:
	@if [ -f $(FMNIST) ]; then echo "Fashion-MNIST: $(dir $(FMNIST))"; \
	elif command -v $(APT_GET) >/dev/null && [ "$$(id -u)" = 0 ]; then \
		$(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq dataset-fashion-mnist >/dev/null; \
	fi; [ -f $(FMNIST) ] || echo "Fashion-MNIST is not installed here (no apt-get, not root, or it failed): the runs will read it from the Hugging Face hub"

# Optional: Debian's docker-compose lets tests/test_docker.py run `docker-compose config` on docker/*.yml
# (that check is skipped without it; no Docker engine is needed).
compose-cli:
	@command -v docker-compose >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null 2>&1 || \
		  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; }; }; } || \
		echo "docker-compose not available: the compose 'config' check will be skipped"

run: install data
	$(BIN)/python -m hetfl.launch configs/quickstart.toml --supernodes 20

# One short real run per method on Fashion-MNIST (configs/quickstart-<method>.toml; each under 2 min here).
quickstart-shefl quickstart-fens quickstart-adaptivefl: quickstart-%: install data
	$(BIN)/python -m hetfl.launch configs/quickstart-$*.toml

# AdaptiveFL on a table that ships offline (scikit-learn's breast cancer as CSV; docs/node-data.md#tables).
quickstart-tabular: install
	$(BIN)/hetfl tables breast_cancer data/breast-cancer
	$(BIN)/python -m hetfl.launch configs/quickstart-tabular.toml

# Three pytest workers on 2 cores (pytest-xdist): the deployment tests spend much of their time waiting on Flower's
# 3-s polls and heartbeats, so a third worker fills some of those waits (measured once each: -n 2 1,196 s, -n 3 975 s,
# -n 4 1,473 s; docs/results/README.md#test-suite-time). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 3
test: install data compose-cli
	$(BIN)/ruff check --select F,E9 hetfl tests scripts
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal --durations=15 -m "not hosts"

# The deployments on hosts and devices the tests make for themselves (marker "hosts"; root): the README's walk-through
# across network namespaces (every method, secured), a slow and a dropping device on shaped links, a Ray cluster of two
# hosts, a CPU-capped device that measures itself. Skipped with the reason where there is no root. CI runs it after
# make test (.ci/run). The tests that measure speed (marker "alone": the capped device against a free one) run after
# the others, in one process: beside the multi-host walk-through the free node was measured at 0.39 of a core.
test-deploy: install data
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist worksteal --durations=5 -m "hosts and not alone"
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider --durations=5 -m "hosts and alone"

# The API reference (docs/reference, Sphinx autodoc of every name in hetfl.__all__): warnings and broken
# cross-references fail the build (tests/test_api.py runs it with these flags). Open docs/reference/_build/html/index.html.
DOCS_FLAGS = -b html -W --keep-going -n -E -q
docs: install
	$(BIN)/python -m sphinx $(DOCS_FLAGS) docs/reference docs/reference/_build/html

# The README's verdict table from the committed runs and the declared studies' verdicts (docs/results/verdicts.toml;
# tests/test_pages.py checks the README says what it computes). Trains nothing.
verdicts: install
	$(BIN)/python scripts/verdict_table.py

test-fast: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow"

# The Compose cluster (docker/compose.yml) on a real Docker engine: installs docker.io, docker-compose, debootstrap
# when missing (root), starts dockerd if none runs (and stops that one), builds the images without a registry
# (docker/build.sh), runs 2 rounds of configs/quickstart.toml to the end and tears the cluster down. Needs no .venv.
# CI runs it after `make test` (.ci/run, SECURITY=auth; docs/deployment.md, "Docker Compose": 506 s cold, 119-202 s warm).
# SECURITY=tls|auth adds the overlays.
DOCKER_PRESET ?= configs/quickstart.toml
DOCKER_ROUNDS ?= 2
SECURITY ?= plain
test-docker:
	PRESET=$(DOCKER_PRESET) ROUNDS=$(DOCKER_ROUNDS) SECURITY=$(SECURITY) bash docker/test-cluster.sh

# ~20 min on 2 cores; run it alone (it times things). BENCH_FLAGS="--only a c" runs a subset.
BENCH_FLAGS ?=
bench: install data
	$(BIN)/python scripts/bench_round.py $(BENCH_FLAGS)

# On a machine with an NVIDIA GPU (< 8 min): CUDA tests, CNN/ResNet-18 samples/s in fp32 and bf16, SHEFL with 100
# clients on fractional GPUs, a 2-round deployment run on CUDA; writes docs/results/gpu-check-<date>.md.
# Without a GPU it says so in one line and exits 0.
gpu-check: install data
	$(BIN)/python scripts/gpu_check.py

# Deployment Engine on this machine: SuperLink + NODES SuperNodes on 127.0.0.1 (Ctrl-C stops them all).
NODES ?= 4
cluster: install data
	$(BIN)/python -m hetfl.cluster --nodes $(NODES) --home $(CURDIR)/.flwr/cluster $(CLUSTER_FLAGS)

clean:
	rm -rf .flwr results .pytest_cache

# --- reproductions (docs/results/) -------------------------------------------------------------------------------
# By default each target tabulates the finished runs committed under docs/results/<name>/runs (copied into
# results/reproduce/<name>/, nothing trained: seconds) and writes results/reproduce/<name>/{table.md,accuracy.png}.
# TRAIN=1 also trains every run that is missing, resuming interrupted ones; the times below are this project's
# 2-core CPU, measured in the docs/results pages.
TRAIN ?=
comma := ,
TRAINING := $(filter 1 yes true,$(TRAIN))
REPRO_MODE := $(if $(TRAINING),,--table-only)
REPRO_DATA := $(if $(TRAINING),data)
define say_mode
	@echo "$(1): $(if $(TRAINING),training the missing runs: $(2),tabulating the runs committed under docs/results (nothing is trained; TRAIN=1 trains the missing ones: $(2)))"
endef

# SHEFL paper comparison (full paper Table 1) on FMNIST Dir(0.6) and pathological 4 shards: SHEFL, Fed-Ensemble,
# FedAvg, FedProx, FedBE at the calibrated local work (10 epochs), 3 seeds, 30 rounds (docs/results/shefl-fmnist-r30.md).
# Training is long: 10 local epochs make a round take 35-135 s on 2 CPU cores (SHEFL's HPCs train every model): the
# 30 runs at ROUNDS=30 took ~19 h here; ROUNDS=100 would take ~60 h (no committed runs at these presets).
# ROUNDS/SEEDS/SPLITS/EXTRA shorten it, e.g. make reproduce-shefl TRAIN=1 SEEDS=0 SPLITS=dir0.6.
# Finished runs committed under docs/results/shefl-fmnist-*/runs are reused (copied, not rerun) from a fresh clone.
ROUNDS ?= 30
SEEDS ?= 0 1 2
SPLITS ?= dir0.6 path4
EXTRA ?=
reproduce-shefl: install $(REPRO_DATA)
	$(call say_mode,$@,~19 h for the 30 runs at ROUNDS=30$(comma) ~60 h at ROUNDS=100$(comma) 35-135 s a round)
	for s in $(SPLITS); do \
	  $(BIN)/python scripts/reproduce.py --name shefl-fmnist-$$s-r$(ROUNDS) --seeds $(SEEDS) --supernodes 100 $(REPRO_MODE) $(REPRO_FLAGS) \
	    --presets $(foreach m,shefl fedensemble fedavg fedprox fedbe,configs/$(m)/fmnist-$$s.toml) \
	    --reuse docs/results/shefl-fmnist-$$s-r$(ROUNDS)/runs --set num-server-rounds=$(ROUNDS) $(EXTRA) || exit 1; \
	done

# SHEFL studies (issue #13): the straggler comparison at seeds STRAGGLER_SEEDS (full paper Fig. 7: SHEFL with 10-epoch HPCs and
# 1-epoch LPCs, FedAvg with every client at LPC work, restricted Fed-Ensemble, and the all-HPC rows FedAvg (HPC) and
# FedEns (HPC), which are the 10-epoch Dir(0.6) presets, reused from the reproduction's runs) on Dir(0.6), and the
# resource-ratio study (ICASSP Table 1b: ratios 1:1 / 1:3 / 1:5, k = 0.1 / 0.02) on Dir(0.1), seeds RATIO_SEEDS.
STRAGGLER_SEEDS ?= 0 1 2
RATIO_SEEDS ?= 0
reproduce-shefl-studies: install $(REPRO_DATA)
	$(call say_mode,$@,~9 h at ROUNDS=30: the 9 straggler runs ~3 h (SHEFL 63-95 s a round)$(comma) the 6 ratio cells ~6.5 h (~130 s a round))
	$(BIN)/python scripts/reproduce.py --name shefl-fmnist-dir0.6-straggler-r$(ROUNDS) --seeds $(STRAGGLER_SEEDS) --supernodes 100 $(REPRO_MODE) $(REPRO_FLAGS) \
	  --presets configs/fedavg/fmnist-dir0.6-lpcwork.toml configs/fedensemble/fmnist-dir0.6-straggler.toml \
	            configs/shefl/fmnist-dir0.6-straggler.toml configs/fedavg/fmnist-dir0.6.toml configs/fedensemble/fmnist-dir0.6.toml \
	  --reuse docs/results/shefl-fmnist-dir0.6-straggler-r$(ROUNDS)/runs docs/results/shefl-fmnist-dir0.6-r$(ROUNDS)/runs \
	  --set num-server-rounds=$(ROUNDS) $(EXTRA)
	$(BIN)/python scripts/reproduce.py --name shefl-fmnist-dir0.1-ratio-r$(ROUNDS) --seeds $(RATIO_SEEDS) --supernodes 100 $(REPRO_MODE) $(REPRO_FLAGS) \
	  --presets $(foreach r,1 3 5,$(foreach k,0.1 0.02,configs/shefl/fmnist-dir0.1-r$(r)-k$(k).toml)) \
	  --reuse docs/results/shefl-fmnist-dir0.1-ratio-r$(ROUNDS)/runs --set num-server-rounds=$(ROUNDS) $(EXTRA)

# SHEFL local-work calibration (issue #13, docs/readings.md#shefl-not-yet): FedAvg on FMNIST Dir(0.6), 100 clients,
# 10 per round, 10 rounds, with 10 local steps / 1 / 5 / 10 local epochs; the table gives each one's round to 80%.
CAL = configs/fedavg/fmnist-dir0.6-literal.toml
calibrate-shefl: install $(REPRO_DATA)
	$(call say_mode,$@,~47 min for the 4 runs)
	$(BIN)/python scripts/reproduce.py --name shefl-calibration-fmnist-dir0.6 --seeds 0 --supernodes 100 $(REPRO_MODE) $(REPRO_FLAGS) \
		--reuse docs/results/shefl-calibration-fmnist-dir0.6/runs --presets "$(CAL)@local-steps=10" "$(CAL)@local-steps=0,local-epochs=1" "$(CAL)@local-steps=0,local-epochs=5" \
		          "$(CAL)@local-steps=0,local-epochs=10" \
		--set num-server-rounds=10

# FENS comparison on FMNIST (20 clients, Dir 0.01/0.05/0.1 drawn as the authors do): FENS (NN aggregator, 500 rounds)
# with FedENS, weighted averaging, voting and one-shot FedAvg on the same local models, 3 seeds; then the aggregator
# sweep on seed 0's ensemble; then iterative FedAdam (authors' update, 50 rounds x 2 local epochs, full participation)
# for FEDADAM_SEEDS. Long: ~10 min per FENS run, ~1.5-2 h per FedAdam run on 2 CPU cores. A reproduction cut off by the
# end of a session resumes its unfinished run from the last checkpoint when started again. FedAdam runs committed under
# docs/results are reused; FENS runs only without TRAIN=1 (training reruns them: the sweep needs the saved ensemble,
# which is not committed; the sweep's table is in docs/results/fens-fmnist.md).
FEDADAM_SEEDS ?= 0
reproduce-fens: install $(REPRO_DATA)
	$(call say_mode,$@,~7 h: 9 FENS runs of ~10 min$(comma) 3 aggregator sweeps of ~15 min$(comma) 3 FedAdam runs of ~95 min)
	$(if $(TRAINING),for a in 0.01 0.05 0.1; do \
	  $(BIN)/python scripts/reproduce.py --name fens-fmnist-dir$$a --seeds $(SEEDS) --supernodes 20 $(REPRO_FLAGS) \
	    --presets configs/fens/fmnist-dir$$a.toml --set $(EXTRA) || exit 1; \
	  $(BIN)/python scripts/fens_sweep.py results/reproduce/fens-fmnist-dir$$a/runs/fens-fmnist-dir$$a-s0 || exit 1; \
	done)
	for a in 0.01 0.05 0.1; do \
	  $(if $(TRAINING),$(BIN)/python scripts/reproduce.py --name fens-fmnist-dir$$a --seeds $(FEDADAM_SEEDS) --supernodes 20 $(REPRO_FLAGS) \
	    --presets configs/fedadam/fmnist-dir$$a.toml --reuse docs/results/fens-fmnist-dir$$a/runs --set $(EXTRA) || exit 1;) \
	  $(BIN)/python scripts/reproduce.py --name fens-fmnist-dir$$a --seeds $(SEEDS) --supernodes 20 --table-only \
	    --presets configs/fens/fmnist-dir$$a.toml configs/fedadam/fmnist-dir$$a.toml $(if $(TRAINING),,--reuse docs/results/fens-fmnist-dir$$a/runs) \
	    --set $(EXTRA) || exit 1; \
	done

# FENS Table 1 on FMNIST (FENS vs one-shot FL, docs/readings.md#oneshot): FedKD, Fed-ET, Co-Boosting and FedCVAE-Ens at Dir(0.01 /
# 0.05 / 0.1) for SEEDS, tabulated with the FENS runs committed under docs/results/fens-fmnist-dir<a>/runs, which give the
# rows of FENS, one-shot FedAvg, FedENS, weighted averaging and voting (never retrained here: make reproduce-fens).
# Per (alpha, seed) FedKD trains phase 1 (20 clients, 5 local epochs) and Fed-ET starts from its saved ensemble
# (oneshot-reuse: the same phase-1 settings, its bytes and time reported); Co-Boosting's clients also hold the 24,000
# images FedKD keeps for the server, so it trains its own phase 1; FedCVAE-Ens's clients train CVAEs (its own phase 1).
# 36 runs, 27 of them with a phase 1 of their own (Fed-ET's 9 reuse FedKD's). Measured at Dir(0.1), seed 0, alone on
# 2 AVX-512 cores: FedKD 11 min (phase 1 64 s, 50 server epochs 527 s), Fed-ET 9 min (489 s), FedCVAE-Ens 8 min (25
# CVAE epochs on the clients 454 s, server 14 s), Co-Boosting 55 min (phase 1 107 s, 50 server epochs 3,098 s: 38 s for
# the first epoch, 89 s for the last, as the pool grows; ~7-8 h estimated at 200).
# ONESHOT_EPOCHS (50, the committed runs) scales FedKD's, Fed-ET's and Co-Boosting's server steps from the authors'
# 200 epochs (shown beside each row; FedKD's and Fed-ET's students reach their teacher within 5-10 epochs, the curves
# are on the FENS page); ONESHOT_EPOCHS= runs the presets' 200. ONESHOT_EXTRA is --set for all four methods (e.g.
# torch-device=cuda). Writes results/reproduce/fens-table1-fmnist/{table.md,accuracy-vs-mb.png}.
ONESHOT_EPOCHS ?= 50
ONESHOT_EXTRA ?=
ONESHOT_DOCS = docs/results/oneshot-fmnist
oneshot_preset = configs/$(1)/fmnist-dir$$a.toml$(if $(ONESHOT_EPOCHS),@$(1)-epochs=$(ONESHOT_EPOCHS))
reproduce-oneshot: install $(REPRO_DATA)
	$(call say_mode,$@,~13 h for the 36 runs at 50 server epochs (per alpha and seed: FedKD 11 min$(comma) Fed-ET 9$(comma) FedCVAE-Ens 8$(comma) Co-Boosting 55); at 200 epochs ~80 h)
	for a in 0.01 0.05 0.1; do \
	  $(BIN)/python scripts/reproduce.py --name oneshot-fmnist-dir$$a --seeds $(SEEDS) --supernodes 20 $(REPRO_MODE) $(REPRO_FLAGS) \
	    --presets $(foreach m,fedkd fedet coboost,"$(call oneshot_preset,$(m))") configs/fedcvae/fmnist-dir$$a.toml --reuse $(ONESHOT_DOCS)-dir$$a/runs \
	    --set $(ONESHOT_EXTRA) || exit 1; \
	done
	$(BIN)/python scripts/oneshot_table.py --name fens-table1-fmnist --alphas 0.01 0.05 0.1 --seeds $(SEEDS) \
	  --runs 'results/reproduce/oneshot-fmnist-dir{alpha}/runs' '$(ONESHOT_DOCS)-dir{alpha}/runs' 'docs/results/fens-fmnist-dir{alpha}/runs'

# FENS against the seven iterative baselines of its paper (Sec. 3.2, Table 10) on FMNIST Dir(0.1), seed 0: each
# method's client lr picked on a 10-round grid of three values (ITER_GRID; the highest mean validation accuracy over
# rounds 8-10, printed in the grid table), then 50 rounds at the pick (ITER_PICKS), each continuing its grid run's
# checkpoint (--extend: 40 more rounds, not 50). Tabulates FENS's crossing (the round and bytes at which each method passes FENS's accuracy) and
# plots accuracy against client MB (results/reproduce/fens-iterative-fmnist-dir0.1/). docs/results/fens-fmnist.md
# A fourth value above a grid whose pick was its largest of three (all but FedNova);
# ITER_PICKS is what the grids picked (docs/results/fens-fmnist.md#iterative).
ITER_GRID := fedavg:0.01,0.03,0.1,0.3 fedprox:0.01,0.03,0.1,0.3 fednova:0.003,0.01,0.03 scaffold:0.003,0.01,0.03,0.1 \
	fedyogi:0.003,0.01,0.03,0.1 fedadam:0.003,0.01,0.03,0.1 fedavg-stc:0.01,0.03,0.1,0.3
ITER_PICKS ?= fedavg@lr=0.1 fedprox@lr=0.1 fednova@lr=0.01 scaffold@lr=0.03 fedyogi@lr=0.1 fedadam@lr=0.1 fedavg-stc@lr=0.1
# and 50 rounds at Scaffold's second grid value: at its pick (0.03) it diverged in round 27 (docs/results/fens-fmnist.md#iterative)
ITER_MORE ?= scaffold@lr=0.01
ITER_DOCS = docs/results/fens-iterative-fmnist-dir0.1
iter_preset = configs/$(word 1,$(subst @, ,$(1)))/fmnist-dir0.1.toml$(if $(word 2,$(subst @, ,$(1))),@$(word 2,$(subst @, ,$(1))))
iter_grid = $(foreach g,$(ITER_GRID),$(foreach lr,$(subst $(comma), ,$(word 2,$(subst :, ,$(g)))),configs/$(word 1,$(subst :, ,$(g)))/fmnist-dir0.1.toml@lr=$(lr)))
reproduce-fens-iterative: install $(REPRO_DATA)
	$(call say_mode,$@,~7 h: 27 grid runs of ~8 min and 8 runs of 40 more rounds of ~30-45 min (44-67 s a round))
	$(BIN)/python scripts/reproduce.py --name fens-iterative-fmnist-dir0.1-lrgrid-r10 --seeds 0 --supernodes 20 $(REPRO_MODE) \
	  --set num-server-rounds=10 --presets $(iter_grid) --reuse $(ITER_DOCS)-lrgrid-r10/runs
	$(BIN)/python scripts/grid_table.py $(if $(TRAINING),results/reproduce/fens-iterative-fmnist-dir0.1-lrgrid-r10/runs,$(ITER_DOCS)-lrgrid-r10/runs) \
	  --fens docs/results/fens-fmnist-dir0.1/runs/fens-fmnist-dir0.1-s0/metrics.json
	$(BIN)/python scripts/reproduce.py --name fens-iterative-fmnist-dir0.1 --seeds 0 --supernodes 20 $(REPRO_MODE) \
	  --presets configs/fens/fmnist-dir0.1.toml $(foreach p,$(ITER_PICKS) $(ITER_MORE),$(call iter_preset,$(p))) \
	  --reuse docs/results/fens-fmnist-dir0.1/runs $(ITER_DOCS)/runs --extend results/reproduce/fens-iterative-fmnist-dir0.1-lrgrid-r10/runs

# AdaptiveFL comparison on FMNIST at the paper's regime (CNN, 100 clients, 10% per round, 4:3:3 uncertain devices,
# 5 local epochs, batch 50): AdaptiveFL vs HeteroFL vs ScaleFL vs All-Large vs Decoupled at Dir(0.6) for SEEDS, the Table 4
# ablations (+Random, +Greed, +C, +S, coarse) at Dir(0.6) seed 0 (AdaptiveFL's own seed-0 run is reused, not run
# twice), and the five methods at Dir(0.3) seed 0.
# 11-14 min per 30-round run here, Decoupled 30 min (it trains 3x the clients); finished runs are reused, interrupted
# ones resume.
# AFL_ROUNDS/SEEDS/AFL_EXTRA change it, e.g. make reproduce-adaptivefl AFL_ROUNDS=20 SEEDS=0.
AFL_ROUNDS ?= 30
AFL_EXTRA ?=
AFL_METHODS = adaptivefl heterofl scalefl all-large decoupled
# finished runs committed under docs/results are reused (copied, not rerun) from a fresh clone
AFL_DOCS = docs/results/adaptivefl-fmnist
reproduce-adaptivefl: install $(REPRO_DATA)
	$(call say_mode,$@,~6 h at AFL_ROUNDS=30: 25 runs of 10-13 min$(comma) Decoupled 30 min)
	$(BIN)/python scripts/reproduce.py --name adaptivefl-fmnist-dir0.6-r$(AFL_ROUNDS) --seeds $(SEEDS) --supernodes 100 $(REPRO_MODE) $(REPRO_FLAGS) \
	  --presets $(foreach m,$(AFL_METHODS),configs/$(m)/fmnist-dir0.6.toml) --reuse $(AFL_DOCS)-dir0.6-r$(AFL_ROUNDS)/runs \
	  --set num-server-rounds=$(AFL_ROUNDS) $(AFL_EXTRA)
	$(BIN)/python scripts/reproduce.py --name adaptivefl-fmnist-dir0.6-ablations-r$(AFL_ROUNDS) --seeds 0 --supernodes 100 $(REPRO_MODE) $(REPRO_FLAGS) \
	  --presets configs/adaptivefl/fmnist-dir0.6.toml $(foreach v,random greed c s coarse,configs/adaptivefl/fmnist-dir0.6-$(v).toml) \
	  --reuse results/reproduce/adaptivefl-fmnist-dir0.6-r$(AFL_ROUNDS)/runs \
	    $(AFL_DOCS)-dir0.6-r$(AFL_ROUNDS)/runs $(AFL_DOCS)-dir0.6-ablations-r$(AFL_ROUNDS)/runs --set num-server-rounds=$(AFL_ROUNDS) $(AFL_EXTRA)
	$(BIN)/python scripts/reproduce.py --name adaptivefl-fmnist-dir0.3-r$(AFL_ROUNDS) --seeds 0 --supernodes 100 $(REPRO_MODE) $(REPRO_FLAGS) \
	  --presets $(foreach m,$(AFL_METHODS),configs/$(m)/fmnist-dir0.3.toml) --reuse $(AFL_DOCS)-dir0.3-r$(AFL_ROUNDS)/runs \
	  --set num-server-rounds=$(AFL_ROUNDS) $(AFL_EXTRA)
