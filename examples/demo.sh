#!/usr/bin/env bash
# commd in two minutes: starts a daemon on a temporary runtime dir, runs 4 ranks of
# examples/trainer (a loop of all-reduces) with a hang injected into rank 2, and shows what an
# operator sees: `commctl health`, the flight-recorder dump the hang produced, and the metrics.
# Everything it starts is stopped at the end; nothing outside the temporary dir is touched.
#
#   scripts/build && examples/demo.sh          # BUILD_DIR=build by default
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
commd=$build/daemon/commd
commctl=$build/tools/commctl/commctl
trainer=${TRAINER:-$build/examples/trainer}
for b in "$commd" "$commctl" "$trainer"; do
  [ -x "$b" ] || { echo "missing $b: build first (scripts/build)"; exit 1; }
done

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# The watchdog calls a collective hung after the group's timeout (the trainer's --timeout-ms),
# and under policy `report` writes a dump and leaves the ranks alone.
"$commd" --runtime-dir "$tmp/run" --metrics-address 127.0.0.1:0 --dump-dir "$tmp/dumps" \
  >"$tmp/commd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q 'commd ready' "$tmp/commd.log" && break; sleep 0.1; done
metrics=$(grep -o 'http://[^ ]*/metrics' "$tmp/commd.log" | head -1)
echo "== commd is up: runtime dir $tmp/run, metrics $metrics"

export COMMD_RUNTIME_DIR=$tmp/run COMMD_JOB_ID=demo
for rank in 0 1 2 3; do
  extra=()
  [ "$rank" = 2 ] && extra=(--hang-at-step 100)
  "$trainer" --group dp --rank "$rank" --world 4 --steps 100000 --step-ms 10 --timeout-ms 5000 \
    "${extra[@]}" >"$tmp/rank$rank.log" 2>&1 &
  pids+=($!)
done
echo "== 4 ranks of examples/trainer run all-reduces; rank 2 will stop before step 100"

hung=""
for _ in $(seq 300); do
  if "$commctl" health 2>/dev/null | grep -Eq 'hung|stuck|lagging'; then hung=1; break; fi
  sleep 0.1
done
[ -n "$hung" ] || echo "(no hang reported within 30 s)"
sleep 0.5
echo
echo "== commctl health"
"$commctl" health || true
echo
echo "== commctl groups"
"$commctl" groups || true
echo
echo "== the dump the hang wrote: the last entry of each rank, and the diagnosis"
for f in $(find "$tmp/dumps" -name 'rank*.json' | sort); do
  python3 - "$f" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
last = d["entries"][-1] if d["entries"] else {}
print(f'{sys.argv[1].split("/dumps/")[1]}: {len(d["entries"])} entries, last seq '
      f'{last.get("collective_seq_id")} {last.get("profiling_name")} {last.get("state")}')
diag = d.get("commd", {}).get("diagnosis")
if diag and sys.argv[1].endswith("rank0.json"):
    print("  diagnosis (in every rank's file):", diag.get("summary"))
    print("  ranks behind:", diag.get("ranks_behind"), " ranks ahead:", diag.get("ranks_ahead"))
PY
done
echo
echo "== metrics"
python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
  "$metrics" | grep -E '^commd_(group_state|hangs_detected_total|aborts_total|collectives_total|nan_|rank_last_progress|flight_recorder_dumps_total)' || true
echo
echo "== rank logs"
tail -n 3 "$tmp"/rank*.log
