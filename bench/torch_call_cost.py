"""What torch and commd's backends add per collective call, on one rank (no peer to wait
for): `dist.all_reduce` of 8 B on a zero-copy tensor through the C++ backend (commd._c10d)
and through the Python one, on torch's do-nothing "fake" backend (torch's own floor), and
the same all-reduce through the binding alone (the SDK's call plus pybind11), each
`--calls` calls back to back, best of `--rounds` rounds, the order of the paths rotating from round to round.

    COMMD_RUNTIME_DIR=... OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 1 \\
        bench/torch_call_cost.py [--calls 20000] [--rounds 5] [--only zcopy]

`--only NAME` loops on one path only (for `perf record`). Figures: docs/PERFORMANCE.md
("The C++ backend's cost per call").
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers backend "fake"

import commd.torch as ct
from torch_allreduce import python_backend_group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="")
    args = parser.parse_args()

    dist.init_process_group("commd")
    assert dist.get_world_size() == 1, "one rank: torchrun --nproc-per-node 1"
    fake = dist.new_group(backend="fake")
    py_group = python_backend_group()
    cpp = not isinstance(dist.group.WORLD._get_backend(torch.device("cpu")),
                         ct.ProcessGroupCommd)
    zero_copy = ct.empty((2,), dtype=torch.float32)
    zero_copy_py = ct.empty((2,), dtype=torch.float32, group=py_group)
    plain = torch.ones(2)
    group = ct.backend_of().commd_group
    view = group.allocate_symmetric(8).view("float32", (2,))
    paths = {
        "zcopy": lambda: dist.all_reduce(zero_copy),
        "zcopy_py": lambda: dist.all_reduce(zero_copy_py, group=py_group),
        "fake": lambda: dist.all_reduce(plain, group=fake),
        "binding": lambda: group.all_reduce(view),
    }
    if args.only:
        fn = paths[args.only]
        for _ in range(args.calls * args.rounds):
            fn()
        return
    best = {k: float("inf") for k in paths}
    names = list(paths)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = paths[name]
            for _ in range(1000):  # warm
                fn()
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / args.calls)
    print(f"# 1 rank, all_reduce of 8 B, {args.calls} calls back to back, best of "
          f"{args.rounds} rotated rounds; zcopy through the "
          f"{'C++ backend (commd._c10d)' if cpp else 'Python backend'}")
    for name, t in best.items():
        print(f"{name:>10} {t * 1e6:8.2f} us per call")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
