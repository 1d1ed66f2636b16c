"""The fused matmuls through commd.torch against the unfused forms over gloo and over commd,
in one torchrun job (PERFORMANCE.md "Issue #18"):

    COMMD_RUNTIME_DIR=... OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \\
        torchrun --standalone --nproc-per-node 2 bench/torch_fused_matmul.py \\
        [--rows 1024] [--k 1024] [--cols 2048] [--rounds 5]

all-gather + matmul: gloo / commd `all_gather_into_tensor` then `gathered @ B`, against
`commd.torch.fused_all_gather_matmul`; matmul + reduce-scatter: `A @ B` then
`reduce_scatter_tensor`, against `commd.torch.fused_matmul_reduce_scatter`. float32; the
variants alternate within each round, each timed on every rank between barriers (over gloo,
outside the timings), the slowest rank's time counted; rank 0 prints the medians. torch's
matmul and OpenBLAS (commd's sgemm) each run one thread per rank.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import commd.torch as ct


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1024, help="A rows per rank")
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--cols", type=int, default=2048, help="B columns")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("commd")
    gloo = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    shard, b = torch.randn(a.rows, a.k), torch.randn(a.k, a.cols)
    a_full = torch.randn(world * a.rows, a.k)
    gathered = torch.empty(world * a.rows, a.k)
    rs_out = torch.empty(a.rows, a.cols)

    def ag_unfused(group):
        dist.all_gather_into_tensor(gathered, shard, group=group)
        return gathered @ b

    def rs_unfused(group):
        dist.reduce_scatter_tensor(rs_out, a_full @ b, group=group)
        return rs_out

    variants = {
        "all-gather+matmul gloo": lambda: ag_unfused(gloo),
        "all-gather+matmul commd unfused": lambda: ag_unfused(None),
        "all-gather+matmul commd fused":
            lambda: ct.fused_all_gather_matmul(shard, [b], 0, return_A=False),
        "matmul+reduce-scatter gloo": lambda: rs_unfused(gloo),
        "matmul+reduce-scatter commd unfused": lambda: rs_unfused(None),
        "matmul+reduce-scatter commd fused":
            lambda: ct.fused_matmul_reduce_scatter(a_full, b, "sum", 0),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rnd in range(a.rounds + 1):  # round 0 warms up
        for name, run in variants.items():
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            run()
            mine = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=gloo)
            if rnd > 0:
                times[name].append(mine.item() * 1e3)
    if rank == 0:
        print(f"{world} ranks, A {world * a.rows} x {a.k} gathered, B {a.k} x {a.cols}, float32, "
              f"{a.rounds} rounds, median ms (slowest rank)")
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, m in med.items():
            print(f"  {name:38s} {m:10.2f}")
        for op in ("all-gather+matmul", "matmul+reduce-scatter"):
            print(f"  {op}: fused / gloo {med[op + ' commd fused'] / med[op + ' gloo']:.2f}, "
                  f"fused / commd unfused "
                  f"{med[op + ' commd fused'] / med[op + ' commd unfused']:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
