"""dist.all_reduce on CUDA tensors through backend "commd" against torch's "nccl", in one
torchrun job (scripts/gpu-tests prints these; docs/gpu-testing.md says what they should be):

    COMMD_RUNTIME_DIR=... torchrun --standalone --nproc-per-node N bench/torch_cuda_allreduce.py \\
        [--iters 200] [--ranks-per-gpu R]

Rank r uses GPU r // R (R: --ranks-per-gpu, default ranks / GPUs rounded up). float32 sum,
8 KiB and 64 MiB, in place, on the current stream; each path timed with CUDA events over
`iters` calls after 10 unmeasured ones, the slowest rank's time counted. commd runs on a
zero-copy tensor (commd.torch.empty: no staging copy) and on a plain tensor (staged). NCCL
refuses two ranks of one communicator on one GPU, so with ranks sharing a GPU its rows say
so instead of a figure. Rank 0 prints, as scripts/gpu-tests collects them:

    BENCH torch-commd allreduce_8KiB_latency_us <v>
    BENCH torch-nccl allreduce_64MiB_busbw_GBps <v>
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import commd.torch as ct

SIZES = {"8KiB": 8 << 10, "64MiB": 64 << 20}


def timed_us(fn, iters: int, gloo) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    dist.barrier(group=gloo)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    t = torch.tensor([start.elapsed_time(stop) * 1e3 / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return t.item()


def report(rank: int, path: str, name: str, nbytes: int, world: int, us: float) -> None:
    if rank != 0:
        return
    if name == "8KiB":
        print(f"BENCH {path} allreduce_8KiB_latency_us {us:.2f}", flush=True)
    else:
        busbw = 2 * (world - 1) / world * nbytes / (us * 1e-6) / 1e9
        print(f"BENCH {path} allreduce_64MiB_busbw_GBps {busbw:.2f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--ranks-per-gpu", type=int, default=0)
    a = p.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    gpus = torch.cuda.device_count()
    per_gpu = a.ranks_per_gpu or -(-world // gpus)
    torch.cuda.set_device(rank // per_gpu)
    dist.init_process_group("commd")  # CPU and CUDA tensors (job_worker.py cuda)
    gloo = dist.new_group(backend="gloo")
    nccl = dist.new_group(backend="nccl") if per_gpu == 1 else None
    for name, nbytes in SIZES.items():
        n = nbytes // 4
        zcopy = ct.empty(n, device="cuda")
        zcopy.fill_(1.0)
        plain = torch.ones(n, device="cuda")
        report(rank, "torch-commd", name, nbytes, world,
               timed_us(lambda: dist.all_reduce(zcopy), a.iters, gloo))
        report(rank, "torch-commd-staged", name, nbytes, world,
               timed_us(lambda: dist.all_reduce(plain), a.iters, gloo))
        if nccl is not None:
            report(rank, "torch-nccl", name, nbytes, world,
                   timed_us(lambda: dist.all_reduce(plain, group=nccl), a.iters, gloo))
        elif rank == 0:
            print(f"BENCH torch-nccl allreduce_{name} skipped: NCCL refuses two ranks of one "
                  f"communicator on one GPU ({per_gpu} ranks per GPU)", flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
