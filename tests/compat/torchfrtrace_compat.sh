#!/usr/bin/env bash
# Checks that PyTorch's flight-recorder analyzer (torchfrtrace) reads commd's torch export.
# Installs torch from PyPI into a virtualenv (several GB; this script stays out of CI), then
# runs a real commd with real rank processes twice:
#   (a) clean: WORLD ranks each record N all-reduces;
#   (b) skip:  the last rank records N-1, i.e. it skipped a collective;
# dumps each run (commctl dump), exports it (commctl fr export --format torch) and runs
# torchfrtrace on both exports. (a) must parse; (b) must parse and name the missing rank.
#
#   tests/compat/torchfrtrace_compat.sh BUILD_DIR [VENV]   (VENV default /work/compat-venv)
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [VENV]}
build=$(cd "$build" && pwd)
venv=${2:-/work/compat-venv}
world=${WORLD:-3}
n=${N:-20}

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import torch' 2>/dev/null || "$venv/bin/pip" install torch
"$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'
frtrace=("$venv/bin/python" -m torch.distributed.flight_recorder.fr_trace)
[ -x "$venv/bin/torchfrtrace" ] && frtrace=("$venv/bin/torchfrtrace")

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

run() {  # run NAME SKIP: one daemon, WORLD ranks; SKIP=1 makes the last rank record one less
  local name=$1 skip=$2 rt="$work/$1/rt" dumps="$work/$1/dumps"
  mkdir -p "$rt" "$dumps"
  "$build/daemon/commd" --runtime-dir "$rt" --metrics-address 127.0.0.1:0 --dump-dir "$dumps" \
    >"$work/$name/daemon.log" 2>&1 &
  local daemon=$!
  pids+=("$daemon")
  for _ in $(seq 100); do grep -q "commd ready" "$work/$name/daemon.log" && break; sleep 0.1; done
  local ranks=()
  for r in $(seq 0 $((world - 1))); do
    local count=$n
    [ "$skip" = 1 ] && [ "$r" = $((world - 1)) ] && count=$((n - 1))
    COMMD_RUNTIME_DIR=$rt COMMD_JOB_ID=compat \
      "$build/tests/integration/rank_process" g "$r" "$world" 0 "record:$count" \
      >"$work/$name/rank$r.log" 2>&1 &
    ranks+=($!)
    pids+=($!)
  done
  for r in $(seq 0 $((world - 1))); do
    for _ in $(seq 300); do grep -q RECORDED "$work/$name/rank$r.log" && break; sleep 0.1; done
  done
  COMMD_RUNTIME_DIR=$rt "$build/tools/commctl/commctl" dump --job compat --group g
  local dir
  dir=$(find "$dumps" -mindepth 3 -maxdepth 3 -type d -name g | head -1)
  "$build/tools/commctl/commctl" fr export --in "$dir" --out "$work/$name/torch" --format torch
  ls "$work/$name/torch"
  for p in "${ranks[@]}" "$daemon"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}

status=0
run clean 0
echo "=== (a) clean run: ${frtrace[*]} ==="
if ! "${frtrace[@]}" "$work/clean/torch" 2>&1 | tee "$work/clean.out"; then
  echo "FAIL: torchfrtrace rejected the clean export"; status=1
fi
run skip 1
echo "=== (b) rank $((world - 1)) skipped a collective: ${frtrace[*]} ==="
if ! "${frtrace[@]}" "$work/skip/torch" 2>&1 | tee "$work/skip.out"; then
  echo "FAIL: torchfrtrace rejected the export with a skipped collective"; status=1
fi
if ! grep -qE "missing ranks: \{$((world - 1))\}" "$work/skip.out"; then
  echo "FAIL: the analyzer did not report rank $((world - 1)) as missing"; status=1
fi
[ $status = 0 ] && echo "PASS: torchfrtrace parsed both exports and reported the missing rank"
exit $status
