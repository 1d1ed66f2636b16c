"""A small model trained with DistributedDataParallel over commd.

    torchrun --standalone --nproc-per-node 4 examples/torch_train.py [--steps 100]

commd (the node's daemon) must run and `commd` must be importable (pip install ./python, or
PYTHONPATH=build/python). Rank 0 prints the commd job; while it trains, `commctl health`
lists the job's group "0" with its ranks; `commctl dump --job <job>` writes every rank's
flight recorder (docs/torch.md). At the end it checks, through commd, that DDP kept every
rank's parameters identical. python/tests/torch/test_example.py runs it.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import commd.torch  # registers the backend "commd"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    dist.init_process_group("commd")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"commd job {commd.torch.backend_of().client.job_id}, group 0", flush=True)
    torch.manual_seed(0)  # the same start on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank)  # each rank its own shard of data
    target = torch.randn(64, 10, generator=torch.Generator().manual_seed(42))
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=data)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:4d}  loss {mean.item():.4f}  ({world} ranks)", flush=True)
    # DDP keeps the replicas identical: every parameter's lowest and highest value over the
    # ranks must be the same.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    low, high = flat.clone(), flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if rank == 0:
        same = "identical" if torch.equal(low, high) else "DIFFERENT"
        print(f"parameters {same} on all {world} ranks ({flat.numel()} values)", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
