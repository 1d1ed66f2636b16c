#!/usr/bin/env bash
# Runs examples/demo.sh on a build dir and checks that it shows what the README promises: the
# watchdog's diagnosis naming the hung rank in `commctl health` and in the dump, and the hang
# in the metrics.
# Usage: demo_test.sh BUILD_DIR [TRAINER] (TRAINER: default BUILD_DIR/examples/trainer)
set -euo pipefail
out=$(BUILD_DIR=$1 TRAINER=${2:-$1/examples/trainer} "$(dirname "$0")/demo.sh" 2>&1) || { echo "$out"; echo "FAIL: demo.sh failed"; exit 1; }
fail() { echo "$out"; echo "FAIL: $*"; exit 1; }
grep -Eq '^demo +dp +undefined +hung +report +lagging: group dp: rank\(s\) \[2\] never entered' <<<"$out" ||
  fail "commctl health does not show dp hung with rank 2 behind"
grep -q 'ranks behind: \[2\]' <<<"$out" || fail "the dump's diagnosis does not name rank 2"
grep -q 'dp/rank2.json: .* nccl:all_reduce completed' <<<"$out" || fail "no dump of rank 2"
grep -q '^commd_hangs_detected_total{job="demo",group="dp",kind="lagging"} 1' <<<"$out" ||
  fail "no lagging hang of job demo's dp in the metrics"
grep -q '^commd_group_state{job="demo",group="dp",state="hung"} 1' <<<"$out" ||
  fail "job demo's dp is not hung in the metrics"
echo "demo ok"
