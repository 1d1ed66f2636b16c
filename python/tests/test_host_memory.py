"""Collectives on ordinary host memory (numpy arrays) with a symmetric buffer as `staging`,
on real rank processes, against a float64 reference; and the arguments they refuse."""

from __future__ import annotations

import numpy as np
import pytest

import ranks

N = 1001  # odd on purpose
NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
         "int32": np.int32, "int64": np.int64}


def inputs(rank: int, n: int) -> np.ndarray:
    i = np.arange(n)
    return (((i * 7 + rank * 3) % 17) - 8).astype(np.float64)


def array(dtype: str, values) -> np.ndarray:
    """`values` in an array of `dtype` (bfloat16 as its uint16 bits)."""
    if dtype == "bfloat16":
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.asarray(values).astype(NUMPY[dtype])


def values(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def collectives(client, rank, world):
    group = client.join_group("h", rank, world, timeout=60.0)
    staging = group.allocate_symmetric(8 * N * world)
    every = np.stack([inputs(r, N * world) for r in range(world)])
    checked = 0
    for dtype in NUMPY:
        # all_reduce in place on the array (bfloat16 names its dtype: numpy has none).
        for op in ["sum", "min", "max"]:
            a = array(dtype, inputs(rank, N))
            finding = group.all_reduce(a, dtype=dtype, op=op, staging=staging)
            want = {"sum": every[:, :N].sum(0), "min": every[:, :N].min(0),
                    "max": every[:, :N].max(0)}[op]
            np.testing.assert_array_equal(values(a, dtype), want, err_msg=f"{dtype} {op}")
            assert finding.nonfinite_ranks == 0
            checked += 1
        # all_gather into a separate array, rank-major.
        out = np.zeros(N * world, NUMPY[dtype])
        group.all_gather(array(dtype, inputs(rank, N)), out, dtype=dtype, staging=staging)
        np.testing.assert_array_equal(values(out, dtype), every[:, :N].reshape(-1))
        # reduce_scatter: this rank's chunk of the world*N inputs' sum.
        out = np.zeros(N, NUMPY[dtype])
        group.reduce_scatter(array(dtype, inputs(rank, N * world)), out, dtype=dtype,
                             op="sum", staging=staging)
        np.testing.assert_array_equal(values(out, dtype),
                                      every.sum(0)[rank * N:(rank + 1) * N])
        # broadcast from the last rank, in place.
        root = world - 1
        a = array(dtype, inputs(rank, N))
        group.broadcast(a, root, dtype=dtype, staging=staging)
        np.testing.assert_array_equal(values(a, dtype), inputs(root, N))
        # all_to_all: block p of the output is block `rank` of rank p's input.
        out = np.zeros(N * world, NUMPY[dtype])
        group.all_to_all(array(dtype, inputs(rank, N * world)), out, dtype=dtype,
                         staging=staging)
        np.testing.assert_array_equal(values(out, dtype),
                                      every[:, rank * N:(rank + 1) * N].reshape(-1))
        checked += 4
    # The dtype from the array's own format when not named; a TensorView of another
    # symmetric buffer is host memory too.
    a = inputs(rank, 7).astype(np.int64)
    group.all_reduce(a, staging=staging)
    np.testing.assert_array_equal(a, every[:, :7].sum(0))
    other = group.allocate_symmetric(4 * 7)
    view = other.view("float32", 7)
    np.asarray(view)[:] = inputs(rank, 7)
    group.all_reduce(view, staging=staging)
    np.testing.assert_array_equal(np.asarray(view), every[:, :7].sum(0))
    return checked


def refused(client, rank, world):
    group = client.join_group("h", rank, world, timeout=60.0)
    staging = group.allocate_symmetric(4096)
    messages: list[str] = []
    expect = ranks.refusals(messages)

    big = np.zeros(1025, np.float32)
    expect("count 1025 x float32 does not fit staging buffer",
           lambda: group.all_reduce(big, staging=staging))
    expect("(allowed: count at most 1024)", lambda: group.all_reduce(big, staging=staging))
    expect("must be writable C-contiguous host memory",
           lambda: group.all_reduce(np.zeros(8, np.float32)[::2], staging=staging))
    expect("must be writable", lambda: group.all_reduce(bytes(32), dtype="float32",
                                                        staging=staging))
    expect("staging must be a commd.SymmetricBuffer",
           lambda: group.all_reduce(np.zeros(8, np.float32), staging=np.zeros(8)))
    expect("'s part of staging buffer",
           lambda: group.all_reduce(np.asarray(staging.view("float32", 8)), staging=staging))
    expect("not a collective type",
           lambda: group.all_reduce(np.zeros(8, np.uint16), staging=staging))
    expect("exceeds the host memory",
           lambda: group.all_gather(np.zeros(8, np.float32), np.zeros(8, np.float32), 8,
                                    staging=staging))
    expect("differs from output's",
           lambda: group.all_to_all(np.zeros(8 * world, np.float32),
                                    np.zeros(8 * world, np.int32), staging=staging))
    return messages


@pytest.mark.parametrize("world", [2, 3])
def test_host_memory_collectives_match_reference(daemon, job, world):
    checked = ranks.run(collectives, world, daemon.runtime_dir, job)
    assert checked == [35] * world


def test_host_memory_bad_arguments_are_refused(daemon, job):
    messages = ranks.run(refused, 2, daemon.runtime_dir, job)
    assert len(messages[0]) == 9
