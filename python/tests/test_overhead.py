"""The binding's cost per call: an 8-byte float32 all_reduce through Python against the
same through the C++ SDK (commd-bench --path sdk), on the same daemon. Figures are printed
(ctest -V -R python_overhead_test), never asserted: the machine is shared and noisy."""

from __future__ import annotations

import os
import subprocess
import time

import numpy as np
import pytest

import ranks

ITERS = 5000
WARMUP = 500


def python_allreduce(client, rank, world):
    group = client.join_group("overhead", rank, world, timeout=60.0)
    buf = group.allocate_symmetric(64)
    x = buf.view("float32", 2)
    np.asarray(x)[:] = rank + 1
    for _ in range(WARMUP):
        group.all_reduce(x)
    group.barrier()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        group.all_reduce(x)
    per_call = (time.perf_counter() - t0) / ITERS * 1e6
    # Sum of (rank + 1) over ranks, multiplied by world each round: check the last result
    # is finite and the same on every rank rather than its exact (overflowing) value.
    return per_call, float(np.asarray(x)[0])


def cxx_allreduce(runtime_dir, world):
    out = subprocess.run(
        [os.environ["COMMD_BENCH"], "-n", str(world), "-b", "8", "-e", "8", "-i", str(ITERS), "-w",
         str(WARMUP), "--runtime-dir", runtime_dir, "--csv"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    assert rows and rows[0]["op"] == "allreduce", out
    return float(rows[0]["time_us"])  # the slowest rank's mean


# One rank: no peer to wait for, so the figures are the call's own cost (SDK + binding);
# two ranks: what a trainer sees, dominated by the wait for the peer on a busy machine.
@pytest.mark.parametrize("world", [1, 2])
def test_allreduce_8_bytes_python_vs_cxx(daemon, job, world):
    results = ranks.run(python_allreduce, world, daemon.runtime_dir, job, timeout=300)
    assert all(r[1] == results[0][1] for r in results)
    py_us = max(r[0] for r in results)
    cxx_us = cxx_allreduce(daemon.runtime_dir, world)
    print(f"\n8 B float32 all_reduce, {world} rank(s), {ITERS} iterations: Python {py_us:.2f} us/call, "
          f"C++ SDK {cxx_us:.2f} us/call, binding adds {py_us - cxx_us:.2f} us/call")


def sdk_loop(client, rank, world):
    import commd

    group = client.join_group("sdk_loop", rank, world, timeout=60.0)
    x = group.allocate_symmetric(8).view("float32", 2)
    np.asarray(x)[:] = rank + 1
    per_call = group._time_all_reduce(x, 3)
    errors = []
    for bad in (0, -1):
        try:
            group._time_all_reduce(x, bad)
        except commd.InvalidArgumentError as e:
            errors.append(str(e))
    return per_call, np.asarray(x).tolist(), errors


def test_the_benchs_sdk_loop_runs_the_all_reduces_it_times(daemon, job):
    """Group._time_all_reduce (bench/torch_allreduce.py's C++ SDK column): `iters` real
    all-reduces of the buffer, a positive time per call; iters below 1 refused naming it."""
    for per_call, values, errors in ranks.run(sdk_loop, 2, daemon.runtime_dir, job):
        assert per_call > 0
        assert values == [12.0, 12.0]  # (1 + 2) x 2 x 2: three sums of two ranks
        assert len(errors) == 2 and "iters 0" in errors[0] and "iters -1" in errors[1], errors
