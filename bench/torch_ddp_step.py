"""One training step of examples/torch_train.py's model under DistributedDataParallel, with
backend commd against backend gloo, in one torchrun job (the same model, the same data).

    COMMD_RUNTIME_DIR=... torchrun --standalone --nproc-per-node 2 bench/torch_ddp_step.py \\
        [--steps 50] [--warmup 10] [--rounds 5] [--batch 32] [--hidden 256]

The two DDP replicas (one over the default commd group, one over a gloo group) start from
the same parameters and alternate in rounds of `steps` steps after `warmup` steps each. A
step is forward, backward (DDP's gradient all-reduce) and SGD; each is timed on every rank
after a barrier (over gloo, outside both timings) and the slowest rank's time counts. Rank 0
prints the median and the quartiles of each backend's steps and their ratio. bench/
torch_vs_gloo.sh runs it after the all-reduce sweep.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import commd.torch  # noqa: F401  (registers the backend "commd")


def make(hidden: int, group) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256, help="the example's is 256")
    args = parser.parse_args()

    dist.init_process_group("commd")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    replicas = {"commd": make(args.hidden, None), "gloo": make(args.hidden, gloo)}
    data = torch.Generator().manual_seed(rank)
    target = torch.randn(64, 10, generator=torch.Generator().manual_seed(42))

    def step(name: str) -> float:
        ddp, opt = replicas[name]
        x = torch.randn(args.batch, 64, generator=data)
        dist.barrier(group=gloo)
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(ddp(x), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - start

    times: dict[str, list[float]] = {name: [] for name in replicas}
    for name in replicas:
        for _ in range(args.warmup):
            step(name)
    for _ in range(args.rounds):
        for name in replicas:
            times[name] += [step(name) for _ in range(args.steps)]
    for name in replicas:  # the slowest rank's time of each step
        t = torch.tensor(times[name], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        times[name] = t.tolist()
    if rank == 0:
        params = sum(p.numel() for p in replicas["commd"][0].parameters())
        print(f"# DDP step, {world} ranks, {params} parameters ({params * 4} bytes of "
              f"gradients), batch {args.batch}: {args.rounds} alternating rounds of "
              f"{args.steps} steps after {args.warmup} warm-up steps each; slowest rank")
        print(f"{'backend':>8} {'median_ms':>10} {'p25_ms':>8} {'p75_ms':>8}")
        med = {}
        for name, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            med[name] = statistics.median(ts)
            print(f"{name:>8} {med[name] * 1e3:>10.3f} {q[0] * 1e3:>8.3f} {q[2] * 1e3:>8.3f}")
        print(f"# gloo/commd median step time: {med['gloo'] / med['commd']:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
