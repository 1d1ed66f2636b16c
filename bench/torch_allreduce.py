"""dist.all_reduce through backend commd (staged and zero-copy) against backend gloo and the
C++ SDK's Group::AllReduce, in one torchrun job, interleaved size by size (float32, sum), and
the binding's own cost per call.

    COMMD_RUNTIME_DIR=... torchrun --standalone --nproc-per-node 2 bench/torch_allreduce.py \\
        [--min-bytes 8] [--max-bytes 64M] [--iters 50] [--rounds 3]

bench/torch_vs_gloo.sh starts a private daemon and runs this for 2 and 4 ranks. Rank 0
prints one row per size:
each path's time per call (calls back to back, the slowest rank) over the best of the
rounds, bus bandwidth
(2 (n-1)/n x bytes / time, nccl-tests' definition) and the ratios the targets name.

The zero-copy path runs twice: through the process group's backend (the C++ one, commd._c10d,
when built: "zcopy") and through a second commd process group made with COMMD_TORCH_CPP=0
(the Python backend alone: "zcopy_py"); "binding" is the same all-reduce called on the commd
group directly through the Python binding (the SDK's Group::AllReduce plus the binding's
~1 us), and "sdk" the C++ SDK's own loop of Group::AllReduce on that buffer, clocked in C++
(Group._time_all_reduce: no Python per call), the reference the zero-copy target names
(zcopy/sdk). The binding and the SDK work on the very
buffer the zero-copy tensor lives in (`--binding-buffer own`: a buffer of its own, as before),
and the order of the paths is shuffled from round to round (`--order fixed`: staged, zcopy,
zcopy_py, binding, gloo in every round, as before), so that no path always comes after the
same other one.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
import torch.distributed as dist

import commd.torch as ct


def size_arg(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def timed(fn, iters: int, group, warmup: int = 1) -> float:
    """Seconds per call of fn() over `iters` calls back to back after `warmup` calls and one
    barrier (as nccl-tests and commd-bench time), the slowest rank's; the barrier and the
    result go over `group` (gloo), so that they stay out of commd's figures."""
    for _ in range(warmup):
        fn()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    t = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def timed_sdk(commd_group, view, iters: int, group, warmup: int) -> float:
    """timed() for the C++ SDK: the calls and their clock in C++ (Group._time_all_reduce)."""
    commd_group._time_all_reduce(view, warmup)
    dist.barrier(group=group)
    t = torch.tensor([commd_group._time_all_reduce(view, iters)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def python_backend_group():
    """A commd process group over every rank served by the Python backend
    (ProcessGroupCommd) alone, whatever COMMD_TORCH_CPP says for the others."""
    saved = os.environ.get("COMMD_TORCH_CPP")
    os.environ["COMMD_TORCH_CPP"] = "0"
    try:
        return dist.new_group(backend="commd")
    finally:
        if saved is None:
            del os.environ["COMMD_TORCH_CPP"]
        else:
            os.environ["COMMD_TORCH_CPP"] = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-bytes", type=size_arg, default=8)
    parser.add_argument("--max-bytes", type=size_arg, default=64 << 20)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="",
                        help="comma-separated sizes (8,1M,...) instead of x4 steps")
    parser.add_argument("--order", choices=("shuffle", "fixed"), default="shuffle")
    parser.add_argument("--binding-buffer", choices=("shared", "own"), default="shared")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed calls before each path's timed ones (1 before)")
    parser.add_argument("--skip", default="",
                        help="paths not run (comma-separated: staged,zcopy_py,gloo); their "
                             "columns read inf")
    args = parser.parse_args()
    explicit = [size_arg(x) for x in args.sizes.split(",")] if args.sizes else []
    if explicit:
        args.max_bytes = max(explicit)

    dist.init_process_group("commd", pg_options=ct.Options(chunk_bytes=max(args.max_bytes, 1 << 20)))
    world, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    backend = ct.backend_of()
    zero_copy = ct.empty((args.max_bytes // 4,), dtype=torch.float32)
    cpp = not isinstance(dist.group.WORLD._get_backend(torch.device("cpu")),
                         ct.ProcessGroupCommd)
    py_group = python_backend_group()
    zero_copy_py = ct.empty((args.max_bytes // 4,), dtype=torch.float32, group=py_group)
    if args.binding_buffer == "shared":  # the symmetric buffer zero_copy starts
        raw_buffer = backend._symmetric_at(zero_copy.data_ptr(), args.max_bytes)
    else:
        raw_buffer = backend.commd_group.allocate_symmetric(args.max_bytes)
    plain = torch.ones(args.max_bytes // 4)

    # The binding alone: an 8-byte all-reduce through commd's Python API, no torch.
    raw = backend.commd_group.allocate_symmetric(8)
    raw_view = raw.view("float32", (2,))
    binding = min(timed(lambda: backend.commd_group.all_reduce(raw_view), 2000, gloo)
                  for _ in range(args.rounds))

    where = "the zero-copy tensor's" if args.binding_buffer == "shared" else "its own"
    if rank == 0:
        print(f"# {world} ranks, float32 sum, time per call over {args.iters} calls, best of "
              f"{args.rounds} interleaved rounds ({args.order} order, binding on {where} buffer); "
              "busbw = 2(n-1)/n x bytes / time")
        print(f"# binding: group.all_reduce(8 B) {binding * 1e6:.2f} us per call")
        print(f"# zcopy: the process group's backend ({'C++, commd._c10d' if cpp else 'Python'});"
              " zcopy_py: the Python backend")
        print(f"{'bytes':>10} {'staged_us':>10} {'zcopy_us':>10} {'zcopy_py_us':>11} "
              f"{'binding_us':>10} {'sdk_us':>10} {'gloo_us':>10} "
              f"{'staged_GBs':>10} {'zcopy_GBs':>10} {'zc_py_GBs':>10} {'bind_GBs':>10} "
              f"{'sdk_GBs':>10} {'gloo_GBs':>10} {'gloo/staged':>11} {'gloo/zcopy':>10} "
              f"{'zcopy/bind':>10} {'zc_py/bind':>10} {'zcopy/sdk':>10}")
    sizes = [args.min_bytes]
    while sizes[-1] * 4 < args.max_bytes:
        sizes.append(sizes[-1] * 4)
    if args.sizes:
        sizes = explicit
    else:
        sizes.append(args.max_bytes)
    for size in sizes:
        n = size // 4
        view = raw_buffer.view("float32", (n,))
        paths = {
            "staged": lambda: dist.all_reduce(plain[:n]),
            "zcopy": lambda: dist.all_reduce(zero_copy[:n]),  # starts its symmetric buffer
            "zcopy_py": lambda: dist.all_reduce(zero_copy_py[:n], group=py_group),
            "binding": lambda: backend.commd_group.all_reduce(view),
            "sdk": None,  # timed_sdk
            "gloo": lambda: dist.all_reduce(plain[:n], group=gloo),
        }
        iters = max(3, min(args.iters, int(args.iters * (1 << 20) / max(size, 1))))
        best = {k: float("inf") for k in paths}
        names = [k for k in paths if k not in args.skip.split(",")]
        for r in range(args.rounds):
            order = list(names)
            if args.order == "shuffle":  # the same order on every rank: seeded by the round
                random.Random(r).shuffle(order)
            for name in order:
                took = (timed_sdk(backend.commd_group, view, iters, gloo, args.warmup)
                        if name == "sdk" else timed(paths[name], iters, gloo, args.warmup))
                best[name] = min(best[name], took)
        if rank == 0:
            bus = {k: 2 * (world - 1) / world * size / v / 1e9 for k, v in best.items()}
            print(f"{size:>10} {best['staged'] * 1e6:>10.2f} {best['zcopy'] * 1e6:>10.2f} "
                  f"{best['zcopy_py'] * 1e6:>11.2f} {best['binding'] * 1e6:>10.2f} "
                  f"{best['sdk'] * 1e6:>10.2f} "
                  f"{best['gloo'] * 1e6:>10.2f} {bus['staged']:>10.3f} {bus['zcopy']:>10.3f} "
                  f"{bus['zcopy_py']:>10.3f} {bus['binding']:>10.3f} {bus['sdk']:>10.3f} "
                  f"{bus['gloo']:>10.3f} {best['gloo'] / best['staged']:>11.2f} "
                  f"{best['gloo'] / best['zcopy']:>10.2f} "
                  f"{bus['zcopy'] / bus['binding']:>10.2f} "
                  f"{bus['zcopy_py'] / bus['binding']:>10.2f} "
                  f"{bus['zcopy'] / bus['sdk']:>10.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
