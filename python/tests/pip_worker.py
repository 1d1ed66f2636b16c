"""A rank of python_pip_install_test and python_torch_pip_install_test, run from outside the
source and build trees with PYTHONPATH naming only where `pip install --target` put the
package: `pip_worker.py binding RUNTIME_DIR JOB RANK OUT` (the binding alone, Debian's
python3) or `pip_worker.py torch OUT` (under torchrun: backend "commd" through commd._c10d).
Each rank checks its results itself (AssertionError: exit 1) and writes OUT/rank<N>.json."""

from __future__ import annotations

import json
import os
import struct
import sys

import commd


def binding(runtime_dir: str, job: str, rank: int, out: str) -> None:
    world = 2
    client = commd.Client.connect(runtime_dir=runtime_dir, job_id=job)
    with client.join_group("pip", rank, world, timeout=60.0) as group:
        n = 1001
        buf = group.allocate_symmetric(4 * n)
        memoryview(buf).cast("B")[:] = struct.pack(f"{n}f", *[float(i + rank) for i in range(n)])
        group.all_reduce(buf, count=n, dtype="float32", op="sum")
        got = struct.unpack(f"{n}f", bytes(memoryview(buf)))
        want = [float(2 * i + 1) for i in range(n)]  # ranks 0 and 1
        assert list(got) == want, got[:8]
    write(out, rank, {"commd": commd.__file__, "executable": sys.executable, "sum": got[n - 1]})


def torch_backend(out: str) -> None:
    import torch
    import torch.distributed as dist

    import commd.torch as ct
    from commd import _c10d

    dist.init_process_group("commd")
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert isinstance(backend, _c10d.Backend), type(backend)  # COMMD_TORCH_CPP=1 too
    before = backend.zero_copy_calls
    t = ct.empty((1001,), dtype=torch.float32)
    t.copy_(torch.arange(1001, dtype=torch.float32) + rank)
    dist.all_reduce(t)
    want = sum(torch.arange(1001, dtype=torch.float32) + r for r in range(world))
    assert torch.equal(t, want), t[:8]
    took = backend.zero_copy_calls - before
    dist.barrier()
    write(out, rank, {"commd": commd.__file__, "c10d": _c10d.__file__, "zero_copy_calls": took,
                      "executable": sys.executable})
    dist.destroy_process_group()


def write(out: str, rank: int, value: dict) -> None:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(value, f)


if __name__ == "__main__":
    if sys.argv[1] == "binding":
        binding(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        torch_backend(sys.argv[2])
