#!/usr/bin/env bash
# scripts/gpu-tests where no GPU is (this project's machines): it must say so and exit 2
# without building anything, list what it would run, and plan the single-GPU run (ranks
# sharing the device; issue #36) from the GPU count alone. Also bash -n, and shellcheck when
# installed. Usage: gpu_tests_test.sh REPO_ROOT
set -uo pipefail
root=${1:?usage: gpu_tests_test.sh REPO_ROOT}
script="$root/scripts/gpu-tests"
fails=0
fail() {
  echo "FAIL: $*" >&2
  fails=1
}
expect() { # expect WHAT NEEDLE TEXT
  grep -qF -- "$2" <<<"$3" || fail "$1: no '$2' in:"$'\n'"$3"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bash -n "$script" || fail "bash -n"
if command -v shellcheck >/dev/null; then shellcheck "$script" || fail "shellcheck"; fi

# No GPU: a clear message, exit 2, nothing built (BUILD_DIR is never made).
out=$(COMMD_GPU_TESTS_GPUS=0 BUILD_DIR="$tmp/build" "$script" 2>"$tmp/err")
rc=$?
[[ $rc == 2 ]] || fail "no GPU: exit $rc, not 2"
expect "no GPU" "no GPU on this machine" "$(cat "$tmp/err")"
expect "no GPU lists the plan" "test CollectiveTest.CudaCollectivesOnTwoGpus" "$out"
[[ ! -e $tmp/build ]] || fail "no GPU: $tmp/build was made"

# One GPU: 8 ranks share it; every rank-count test runs, the 2-device ones skip.
out=$(COMMD_GPU_TESTS_GPUS=1 "$script" --dry-run)
rc=$?
[[ $rc == 0 ]] || fail "dry run on 1 GPU: exit $rc"
expect "1 GPU" "ranks per GPU: 8" "$out"
grep -qE 'CudaCollectivesOnEightGpus +ranks:8 +runs' <<<"$out" || fail "8 ranks on 1 GPU: $out"
grep -qE 'TwoGpuAllReduceTest.* gpus:2 +skips \(needs 2 GPU\(s\), has 1\)' <<<"$out" ||
  fail "2-device test on 1 GPU: $out"
expect "dry run" "nothing built or run" "$out"

# --ranks-per-gpu 2 on one GPU: 8 ranks need 4 GPUs; --quick drops them from the plan.
out=$(COMMD_GPU_TESTS_GPUS=1 "$script" --dry-run --ranks-per-gpu 2)
grep -qE 'CudaCollectivesOnEightGpus +ranks:8 +skips \(needs 4 GPU' <<<"$out" ||
  fail "--ranks-per-gpu 2: $out"
out=$(COMMD_GPU_TESTS_GPUS=8 "$script" --dry-run --quick)
expect "8 GPUs" "ranks per GPU: 1" "$out"
grep -q 'EightGpus' <<<"$out" && fail "--quick still lists the 8-rank test: $out"

# Arguments it does not know are refused, naming them.
COMMD_GPU_TESTS_GPUS=1 "$script" --bogus >/dev/null 2>"$tmp/err"
rc=$?
[[ $rc == 2 ]] || fail "--bogus: exit $rc"
expect "--bogus" "unknown argument '--bogus'" "$(cat "$tmp/err")"
COMMD_GPU_TESTS_GPUS=1 "$script" --ranks-per-gpu 0 >/dev/null 2>&1 && fail "--ranks-per-gpu 0 accepted"

((fails)) && exit 1
echo "gpu_tests_test: OK"
