#!/usr/bin/env bash
# `make test-docker`: the Compose cluster run to the end on a real Docker engine, from a fresh Debian machine
# (docs/deployment.md, "Docker Compose"). As root:
#   1. installs what is missing with apt-get: docker.io, docker-compose, debootstrap, python3-venv, dataset-fashion-mnist;
#   2. starts dockerd when no engine answers (log: docker/.cache/dockerd.log) and stops that one, by its PID, at the end;
#   3. builds the images (docker/build.sh: debootstrap base, wheelhouse, project image; each step skipped when done);
#   4. starts docker/compose.yml (SuperLink + 4 SuperNodes) as compose project hetfltest, runs ROUNDS rounds of PRESET
#      from the `cli` service to the end, and checks that Flower reports the run finished:completed and that its
#      metrics.json holds ROUNDS rounds with every sampled client's reply;
#   5. tears the cluster down (containers, network, volumes), also on failure or Ctrl-C. Images and docker/.cache stay
#      (the warm cache of the next run).
# Environment: PRESET (configs/quickstart.toml; a file under configs/), ROUNDS (2), SECURITY (plain | tls | auth: with docker/compose.tls.yml,
# and compose.auth.yml with the SuperNodes' keys registered first), RUN_TIMEOUT (seconds for the run, 1800),
# DOCKERD_FLAGS (flags of the dockerd started here; default "--iptables=false --ip-forward=false": the cluster talks
# over its compose bridge and the host reaches the published port through docker-proxy, so no NAT or forwarding is
# needed and the host's firewall rules, FORWARD policy and ip_forward stay as they were; add e.g. --storage-driver vfs
# where overlay2 does not work).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PRESET="${PRESET:-configs/quickstart.toml}"
ROUNDS="${ROUNDS:-2}"
SECURITY="${SECURITY:-plain}"
RUN_TIMEOUT="${RUN_TIMEOUT:-1800}"
NODES=4   # the SuperNodes of docker/compose.yml
CACHE=docker/.cache
FMNIST=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
T0=$SECONDS
say() { printf 'test-docker [%4ss]: %s\n' "$((SECONDS - T0))" "$*"; }
die() { echo "test-docker: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || { echo "test-docker: error: run as root (apt-get, dockerd and debootstrap need it)" >&2; exit 2; }
case "$PRESET" in configs/*.toml) [ -f "$PRESET" ];; *) false;; esac \
  || { echo "test-docker: error: PRESET '$PRESET' is not a file under configs/ (mounted into the cli container); expected e.g. configs/quickstart.toml" >&2; exit 2; }
case "$SECURITY" in plain|tls|auth) ;; *) echo "test-docker: error: SECURITY='$SECURITY'; expected plain, tls or auth" >&2; exit 2;; esac
mkdir -p "$CACHE"

# 1. Packages.
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
python3 -c 'import tomllib' 2>/dev/null || need+=(python3)
python3 -m pip --version >/dev/null 2>&1 || python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
[ -f "$FMNIST" ] || need+=(dataset-fashion-mnist)
[ "$SECURITY" = plain ] || command -v ssh-keygen >/dev/null || need+=(openssh-client)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them"
  say "apt-get install ${need[*]}"
  apt_install() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >"$CACHE/apt.log" 2>&1; }
  apt_install "${need[@]}" || { apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null 2>&1; apt_install "${need[@]}"; } \
    || die "apt-get install ${need[*]} failed; see $CACHE/apt.log"
fi
DOCKER="${DOCKER:-$( [ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker )}"
export DOCKER

# 2. The engine: the running one, or one started here and stopped at the end.
dockerd_pid=""
declare -A bridge_nf=()
C=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ ${#C[@]} -gt 0 ]; then
    [ $rc = 0 ] || { echo "test-docker: last logs of the cluster:"; "${C[@]}" logs --no-color --tail 30 2>&1 | tail -n 150; }
    say "tearing the cluster down (containers, network, volumes)"
    "${C[@]}" down -v --remove-orphans >/dev/null 2>&1 || echo "test-docker: warning: '${C[*]} down -v' failed" >&2
  fi
  if [ -n "$dockerd_pid" ]; then
    say "stopping the dockerd started here (PID $dockerd_pid)"
    kill -TERM "$dockerd_pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$dockerd_pid" 2>/dev/null && { echo "test-docker: warning: dockerd (PID $dockerd_pid) still runs after 60 s" >&2; }
    ip link delete docker0 2>/dev/null || true   # the default bridge it made
    for f in "${!bridge_nf[@]}"; do echo "${bridge_nf[$f]}" > "$f" 2>/dev/null || true; done
  fi
  say "$([ $rc = 0 ] && echo passed || echo "FAILED (exit $rc)") in $((SECONDS - T0)) s"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if "$DOCKER" info >/dev/null 2>&1; then
  say "using the running Docker engine ($("$DOCKER" info -f '{{.ServerVersion}}, storage {{.Driver}}'))"
else
  # dockerd loads br_netfilter, which makes bridged traffic pass the host's iptables: put its switches back at the end
  # as they were (0 = not loaded before).
  for f in /proc/sys/net/bridge/bridge-nf-call-{iptables,ip6tables,arptables}; do bridge_nf[$f]="$(cat "$f" 2>/dev/null || echo 0)"; done
  # shellcheck disable=SC2086  # DOCKERD_FLAGS is a list of flags
  dockerd ${DOCKERD_FLAGS---iptables=false --ip-forward=false} >"$CACHE/dockerd.log" 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 1; done
  "$DOCKER" info >/dev/null 2>&1 || die "dockerd did not answer within 60 s; see $CACHE/dockerd.log"   # cleanup stops it
  say "started dockerd (PID $dockerd_pid, log $CACHE/dockerd.log; $("$DOCKER" info -f '{{.ServerVersion}}, storage {{.Driver}}'))"
fi
if [ "$("$DOCKER" info -f '{{.Driver}}')" = vfs ]; then
  say "warning: storage driver vfs copies the whole ~7 GB image for every container: ~45 GB of disk for this test"
fi

# 3. Images.
say "building the images (docker/build.sh)"
bash docker/build.sh

# 4. The cluster and one run.
files=(-f docker/compose.yml)
conn=docker
case "$SECURITY" in
  tls) files+=(-f docker/compose.tls.yml); conn=docker-tls;;
  auth) files+=(-f docker/compose.tls.yml -f docker/compose.auth.yml); conn=docker-tls;;
esac
if command -v docker-compose >/dev/null; then C=(docker-compose); else C=("$DOCKER" compose); fi
C+=(-p hetfltest "${files[@]}")
HETFL_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
HETFL_RESULTS="$ROOT/$CACHE/test-results"
export HETFL_PORT HETFL_RESULTS
rm -rf "$HETFL_RESULTS" && mkdir -p "$HETFL_RESULTS"
"${C[@]}" down -v --remove-orphans >/dev/null 2>&1 || true   # what an interrupted earlier run left
if [ "$SECURITY" != plain ]; then
  bash docker/certs/generate.sh >/dev/null
fi
if [ "$SECURITY" = auth ]; then
  bash docker/keys/generate.sh "$NODES" >/dev/null
  "${C[@]}" up -d superlink 2>&1 | grep -v '^$' || true
  for i in $(seq 0 $((NODES - 1))); do
    for _ in $(seq 10); do   # the SuperLink may still be starting
      "${C[@]}" run --rm -T cli flwr supernode register "/keys/supernode-$i.pub" "$conn" >"$CACHE/register.log" 2>&1 && break
      sleep 2
    done
    grep -q 'registered successfully' "$CACHE/register.log" || die "could not register supernode-$i: $(tail -n 3 "$CACHE/register.log")"
  done
  say "registered the $NODES SuperNodes' public keys"
fi
HETFL_DATA="$ROOT/$CACHE/test-data"   # each SuperNode mounts only its client-<i> (node-local data)
export HETFL_DATA
rm -rf "$HETFL_DATA"
say "exporting $PRESET's split for $NODES clients to $HETFL_DATA (python -m hetfl.export, in the project image)"
"$DOCKER" run --rm --entrypoint python -v "$HETFL_DATA:/out" \
    -v /usr/share/datasets/fashion-mnist:/usr/share/datasets/fashion-mnist:ro "${HETFL_IMAGE:-hetfl:latest}" \
    -m hetfl.export "$PRESET" --out /out --clients "$NODES" >/dev/null || die "python -m hetfl.export failed"
say "docker-compose up: SuperLink + $NODES SuperNodes ($SECURITY; SuperLink on 127.0.0.1:$HETFL_PORT)"
"${C[@]}" up -d 2>&1 | grep -v '^$' || true
[ "$("${C[@]}" ps -q | wc -l)" -ge $((NODES + 1)) ] || die "the cluster did not start: $("${C[@]}" ps 2>&1)"
run_name="docker-test-$(date +%Y%m%d-%H%M%S)"
say "running $ROUNDS rounds of $PRESET on the cluster (run-name $run_name)"
timeout "$RUN_TIMEOUT" "${C[@]}" run --rm -T -e HETFL_CONNECTION="$conn" cli hetfl-submit "$PRESET" \
    "num-server-rounds=$ROUNDS" "min-available-nodes=$NODES" fraction-train=1.0 "run-name=\"$run_name\"" \
  || die "the run did not complete (exit $?)"
python3 - "$HETFL_RESULTS/$run_name/metrics.json" "$ROUNDS" "$NODES" <<'PY' || die "metrics.json check failed"
import json, sys
path, rounds, nodes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = json.load(open(path))
done = [r for r in m["rounds"] if r["round"] >= 1]
assert m["summary"]["rounds_completed"] == rounds == len(done), (m["summary"], len(done))
assert all(r["replies"] == nodes and r["failures"] == 0 for r in done), [(r["replies"], r["failures"]) for r in done]
print(f"test-docker: {path}: {rounds} rounds, {nodes} replies each, final accuracy {m['summary']['final_accuracy']:.4f}")
PY
