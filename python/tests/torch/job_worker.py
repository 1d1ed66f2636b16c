"""One rank of a torch.distributed job on backend commd for test_flight_recorder.py and
test_other_job.py, started by torchrun: `job_worker.py SCENARIO OUT_DIR`. Like worker.py,
each scenario checks what it can in the rank and writes what the test reads back to
OUT_DIR/rank<N>.json."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import commd.torch as ct
from worker import _expect_failure, write


def _wait_for(path: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {seconds} s")
        time.sleep(0.1)


def flight_recorder(out_dir: str) -> None:
    """A few collectives on the default group and on a subgroup described "tp"; then the
    last rank skips an all-reduce: the others' call hangs until the watchdog (policy notify)
    aborts it. While every rank is still in its groups, the last rank dumps the job with
    `commctl dump` and prints what it wrote; the test exports and analyzes that dump."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = dist.new_group(list(range(world)), group_desc="tp")
    for step in range(3):
        t = torch.full((8,), float(rank + step))
        dist.all_reduce(t)
        dist.all_reduce(torch.ones(4), group=tp)
    dist.broadcast(torch.ones(5), src=0)
    dist.all_gather_into_tensor(torch.empty(3 * world), torch.ones(3), group=tp)
    default_backend, tp_backend = ct.backend_of(), ct.backend_of(tp)
    if rank != world - 1:
        _expect_failure(out_dir, lambda: dist.all_reduce(torch.ones(16)))  # the skipped one
        _wait_for(os.path.join(out_dir, "dumped"))
        return
    group = default_backend.commd_group
    deadline = time.monotonic() + 120
    while not group.abort_requested and time.monotonic() < deadline:
        time.sleep(0.1)
    dump = subprocess.run([os.environ["COMMCTL"], "dump", "--job", default_backend.client.job_id],
                          capture_output=True, text=True, timeout=120)
    groups = {g["name"]: g.get("description") for g in default_backend.client.groups()}
    write(out_dir, {"abort_reason": group.abort_reason, "dump": dump.stdout + dump.stderr,
                    "dump_code": dump.returncode, "groups": groups,
                    "tp_name": tp_backend.commd_group.name})
    with open(os.path.join(out_dir, "dumped"), "w"):
        pass


def other_job(out_dir: str) -> None:
    """init_process_group on ranks whose COMMD_JOB_ID the test set differently: every rank
    must fail at once with an error naming both jobs (not wait out the group's timeout).
    With OTHER_JOB_RANK unset every rank keeps the test's COMMD_JOB_ID (a second job under
    the id of one that is running)."""
    if os.environ.get("OTHER_JOB_RANK") == os.environ["RANK"]:
        os.environ["COMMD_JOB_ID"] = "other-job"
    try:
        dist.init_process_group("commd", timeout=datetime.timedelta(seconds=300))
    except Exception as e:  # noqa: BLE001 (the test reads which)
        write(out_dir, {"raised": type(e).__name__, "message": str(e)})
        return
    write(out_dir, {"raised": None})
    dist.destroy_process_group()


def hold(out_dir: str) -> None:
    """A job that keeps its process group "0" formed until the test creates OUT_DIR/release."""
    dist.init_process_group("commd", timeout=datetime.timedelta(seconds=300))
    write(out_dir, {"job": ct.backend_of().client.job_id})
    _wait_for(os.path.join(out_dir, "release"), 300)
    dist.destroy_process_group()


def cuda(out_dir: str) -> None:
    """CUDA tensors on backend "commd" (needs a GPU per rank): staged and zero-copy
    collectives on torch's current stream against a float64 reference, a tensor of several
    staging chunks as one flight-recorder entry, and a call mixing CPU and CUDA tensors
    refused."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        t = torch.arange(1000, dtype=torch.float32, device="cuda") + rank
        dist.all_reduce(t)
        want = torch.arange(1000, dtype=torch.float64) * world + sum(range(world))
        torch.testing.assert_close(t.cpu().double(), want)
        z = ct.empty(1000, device="cuda")
        assert z.is_cuda
        z.fill_(rank + 1)
        dist.all_reduce(z)
        assert z.eq(world * (world + 1) / 2).all().item()
        out = torch.empty(3 * world, device="cuda")
        dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device="cuda"))
        want = torch.arange(world, dtype=torch.float32).repeat_interleave(3)
        torch.testing.assert_close(out.cpu(), want)
        # Several staging chunks (Options.chunk_bytes, 16 MiB by default): one entry of the
        # whole tensor, marked started and completed on this stream.
        n = 3 * ct.Options.DEFAULT_CHUNK_BYTES // 4 + 5
        big = torch.ones(n, device="cuda")
        dist.all_reduce(big)
        assert big.eq(world).all().item()
        stream.synchronize()
    dump = ct.backend_of().client.dump(group=ct.backend_of()._cuda.commd_group.name)
    path = [f for f in dump["files"] if f.endswith(f"/rank{rank}.json")][0]
    with open(path) as f:
        entries = json.load(f)["entries"]
    whole = [e["state"] for e in entries if e["input_sizes"] == [[n]]]
    chunks = [e for e in entries if e["input_sizes"] == [[ct.Options.DEFAULT_CHUNK_BYTES // 4]]]
    try:
        dist.all_gather([torch.empty(3), torch.empty(3, device="cuda")],
                        torch.ones(3, device="cuda"))
    except ValueError as e:
        mixed = str(e)
    else:
        raise AssertionError("mixed devices: no ValueError")
    write(out_dir, {"mixed": mixed, "whole": whole, "chunks": len(chunks)})
    dist.destroy_process_group()


def cpu_commd_cuda_nccl(out_dir: str) -> None:
    """init_process_group("cpu:commd,cuda:nccl"): CPU tensors on commd, described as torch
    describes the default group."""
    dist.init_process_group("cpu:commd,cuda:nccl", timeout=datetime.timedelta(seconds=120))
    t = torch.ones(8)
    dist.all_reduce(t)
    assert t.eq(dist.get_world_size()).all()
    backend = ct.backend_of()
    groups = {g["name"]: g["description"] for g in backend.client.groups()}
    write(out_dir, {"groups": groups})
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    scenario, out_dir = sys.argv[1:]
    if "TEST_COMMD_JOB_ID" in os.environ:  # torchrun() in the tests drops COMMD_JOB_ID
        os.environ["COMMD_JOB_ID"] = os.environ["TEST_COMMD_JOB_ID"]
    if scenario in ("other_job", "hold", "cpu_commd_cuda_nccl"):
        {"other_job": other_job, "hold": hold,
         "cpu_commd_cuda_nccl": cpu_commd_cuda_nccl}[scenario](out_dir)
        return
    timeout = float(os.environ.get("COMMD_TEST_PG_TIMEOUT", "60"))
    if scenario == "cuda":
        dist.init_process_group("commd", timeout=datetime.timedelta(seconds=timeout))
        cuda(out_dir)
        return
    dist.init_process_group("commd", pg_options=ct.Options(watchdog_policy="notify"),
                            timeout=datetime.timedelta(seconds=timeout))
    flight_recorder(out_dir)


if __name__ == "__main__":
    main()
