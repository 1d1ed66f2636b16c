#!/usr/bin/env bash
# dist.all_reduce through backend commd (staged and zero-copy) against gloo, the binding and
# the C++ Group::AllReduce, interleaved in one torchrun job (bench/torch_allreduce.py) on a
# private daemon: 2 and 4 ranks, float32 sum, 8 B to 64 MiB; then a DDP step
# (bench/torch_ddp_step.py, 2 ranks). Figures go to docs/PERFORMANCE.md ("PyTorch backend").
#
#   bench/torch_vs_gloo.sh [BUILD_DIR]      (default build; torch from scripts/torch-venv)
#   RANKS="2 4" MAX=64M ITERS=50 ROUNDS=3 DDP_HIDDEN="256 4096" bench/torch_vs_gloo.sh build
#   SIZES=8,1M,2M,8M,32M (sizes instead of x4 steps)
#   TORCH_ARGS="--order fixed --binding-buffer own --warmup 1" (more arguments of
#   torch_allreduce.py; those give the bench as it was before 2026-11-25)
#   DDP_HIDDEN="" (no DDP step)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
python="${COMMD_TORCH_PYTHON:-$(scripts/torch-venv)/bin/python}"
max=${MAX:-64M}
tmp=$(mktemp -d)
"$build/daemon/commd" --runtime-dir "$tmp/run" --metrics-address 127.0.0.1:0 \
  --dump-dir "$tmp/dumps" >"$tmp/commd.log" 2>&1 &
daemon=$!
trap 'kill $daemon; wait $daemon 2>/dev/null; rm -rf "$tmp"' EXIT
until grep -q "commd ready" "$tmp/commd.log"; do
  kill -0 $daemon || { cat "$tmp/commd.log"; exit 1; }
  sleep 0.1
done
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
for n in ${RANKS:-2 4}; do
  echo "## torchrun --nproc-per-node $n bench/torch_allreduce.py --max-bytes $max${SIZES:+ --sizes $SIZES}"
  COMMD_RUNTIME_DIR="$tmp/run" PYTHONPATH="$build/python" OMP_NUM_THREADS=1 \
    "$python" -m torch.distributed.run --standalone --nproc-per-node "$n" \
    bench/torch_allreduce.py --max-bytes "$max" --iters "${ITERS:-50}" --rounds "${ROUNDS:-3}" \
    ${SIZES:+--sizes "$SIZES"} ${TORCH_ARGS:-} \
    2> >(grep -v "^W1\|Warning\|\*\*\*\*" >&2)
done
# A DDP step of examples/torch_train.py's model (and a wider one), commd against gloo.
for hidden in ${DDP_HIDDEN-256 4096}; do
  echo "## torchrun --nproc-per-node 2 bench/torch_ddp_step.py --hidden $hidden"
  COMMD_RUNTIME_DIR="$tmp/run" PYTHONPATH="$build/python" OMP_NUM_THREADS=1 \
    "$python" -m torch.distributed.run --standalone --nproc-per-node 2 \
    bench/torch_ddp_step.py --hidden "$hidden" 2> >(grep -v "^W1\|Warning\|\*\*\*\*" >&2)
done
