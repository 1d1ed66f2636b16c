#!/usr/bin/env bash
# Fails when the reduction loops of the shipped build are scalar again: disassembles the
# library holding element_loops.cc and looks for packed instructions in the float, double and
# int64 sum/min loops of the AVX2 clone (ymm registers) and in the float sum of the baseline clone
# (SSE2 xmm). GCC at -O2 leaves these loops scalar (addss), so a lost per-file -O3 in
# kernels/CMakeLists.txt or kernels/BUILD.bazel, or a loop the vectoriser gives up on, fails.
# Usage: vectorised_loops_test.sh LIBRARY_OR_OBJECT...
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 LIBRARY_OR_OBJECT..." >&2; exit 2; }
dis=$(mktemp)
trap 'rm -f "$dis"' EXIT
for f in "$@"; do objdump -d --no-show-raw-insn -C "$f" >>"$dis"; done

# expect FUNCTION REGEX: some instruction of FUNCTION (a substring of its demangled name)
# matches REGEX.
failures=0
expect() {
  local count
  count=$(awk -v fn="$1" -v pat="$2" '
    /^[0-9a-f]+ <.*>:$/ { inside = index($0, fn) > 0; next }
    inside && $0 ~ pat { n++ }
    END { print n + 0 }' "$dis")
  if [ "$count" -eq 0 ]; then
    echo "FAIL: no instruction matching /$2/ in $1 (scalar loop?)"
    failures=$((failures + 1))
  else
    echo "ok: $count instructions matching /$2/ in $1"
  fi
}
op='(commd::ReduceOp)'
expect "ReduceAvx2<float, ${op}0>" 'vaddps.*%ymm'
expect "ReduceAvx2<float, ${op}2>" 'vblendvps.*%ymm'
expect "ReduceAvx2<double, ${op}0>" 'vaddpd.*%ymm'
expect "ReduceAvx2<long, ${op}0>" 'vpaddq.*%ymm'
expect "ReduceAvx2<long, ${op}3>" 'vpcmpgtq.*%ymm'
expect "ReduceAvx2<int, ${op}0>" 'vpaddq.*%ymm'
expect "ReduceBaseline<float, ${op}0>" '[^v]addps.*%xmm'
expect "ReduceBaseline<long, ${op}0>" 'paddq.*%xmm'
[ "$failures" -eq 0 ] || { echo "$failures loop(s) not vectorised"; exit 1; }
