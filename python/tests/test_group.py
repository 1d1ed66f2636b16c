"""Collectives through the binding on real rank processes, against a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import ranks

DTYPES = ["float32", "float16", "bfloat16", "int32", "int64"]
# Relative tolerance of an average (the only inexact result: inputs are small integers).
AVG_RTOL = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}
N = 1001  # odd on purpose


def inputs(rank: int, n: int) -> np.ndarray:
    i = np.arange(n)
    return (((i * 7 + rank * 3) % 17) - 8).astype(np.float64)


BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def reference(world: int, n: int, op: str) -> np.ndarray:
    x = np.stack([inputs(r, n) for r in range(world)])
    if op in BITWISE:
        return BITWISE[op].reduce(x.astype(np.int64), axis=0).astype(np.float64)
    return {"sum": x.sum(0), "avg": x.mean(0), "min": x.min(0), "max": x.max(0),
            "product": x.prod(0)}[op]


def collectives(client, rank, world):
    group = client.join_group("g", rank, world, timeout=60.0)
    buf = group.allocate_symmetric(8 * N * world)
    out = group.allocate_symmetric(8 * N * world)
    checked = 0
    for dtype in DTYPES:
        view, io = ranks.views(buf, dtype, N)
        for op in ["sum", "avg", "min", "max", "product", *BITWISE]:
            if op == "avg" and dtype.startswith("int"):
                continue
            if op in BITWISE and not dtype.startswith("int"):
                continue  # integer and bool types only
            if op == "product" and dtype in ("float16", "bfloat16"):
                continue  # would round: the kernels' own tests check their products
            ranks.write(io, dtype, inputs(rank, N))
            finding = group.all_reduce(view, op=op)
            want = reference(world, N, op)
            np.testing.assert_allclose(ranks.read(io, dtype), want,
                                       rtol=AVG_RTOL.get(dtype, 0) if op == "avg" else 0,
                                       err_msg=f"all_reduce {dtype} {op}")
            assert finding.nonfinite_ranks == 0
            checked += 1
        # all_gather: rank-major concatenation of every rank's input.
        ranks.write(io, dtype, inputs(rank, N))
        gathered, gathered_io = ranks.views(out, dtype, N * world)
        group.all_gather(view, gathered)
        np.testing.assert_array_equal(ranks.read(gathered_io, dtype),
                                      np.concatenate([inputs(r, N) for r in range(world)]))
        # reduce_scatter: this rank's chunk of the sum of every rank's world*N input.
        big, big_io = ranks.views(buf, dtype, N * world)
        ranks.write(big_io, dtype, inputs(rank, N * world))
        chunk, chunk_io = ranks.views(out, dtype, N)
        group.reduce_scatter(big, chunk, op="max")
        want = reference(world, N * world, "max")[rank * N:(rank + 1) * N]
        np.testing.assert_array_equal(ranks.read(chunk_io, dtype), want)
        checked += 2
    return checked


def coalesced_and_offsets(client, rank, world):
    group = client.join_group("g", rank, world, timeout=60.0)
    buf = group.allocate_symmetric(1 << 16)
    # Mixed types at several offsets, one collective.
    a, a_io = ranks.views(buf, "float32", 37, offset=0)
    b, b_io = ranks.views(buf, "int64", (5, 3), offset=4096)
    c, c_io = ranks.views(buf, "bfloat16", 11, offset=8192)
    for io, dtype, n in [(a_io, "float32", 37), (b_io, "int64", 15), (c_io, "bfloat16", 11)]:
        ranks.write(io, dtype, inputs(rank, n).reshape(io.shape))
    group.all_reduce_coalesced([a, b, c], op="sum")
    for io, dtype, n in [(a_io, "float32", 37), (b_io, "int64", 15), (c_io, "bfloat16", 11)]:
        np.testing.assert_array_equal(ranks.read(io, dtype).ravel(), reference(world, n, "sum"))
    # A single view away from the buffer's start (the coalesced path underneath).
    d, d_io = ranks.views(buf, "int32", 100, offset=12000)
    ranks.write(d_io, "int32", inputs(rank, 100))
    group.all_reduce(d, op="min")
    np.testing.assert_array_equal(ranks.read(d_io, "int32"), reference(world, 100, "min"))
    # Whole buffer with dtype and count named by the call.
    ranks.write(buf.view("float32", 10), "float32", inputs(rank, 10))
    group.all_reduce(buf, 10, "float32", "max")
    np.testing.assert_array_equal(ranks.read(buf.view("float32", 10), "float32"),
                                  reference(world, 10, "max"))
    # Barrier: what a rank wrote before it is in its peers' view after it.
    np.asarray(buf)[60000] = 100 + rank
    group.barrier()
    seen = [int(np.asarray(buf.peer(r))[60000]) for r in range(world)]
    assert seen == [100 + r for r in range(world)], seen
    group.barrier()
    # NaN check: one rank's NaN is counted there and seen by every rank.
    x, x_io = ranks.views(buf, "float32", 8)
    vals = np.ones(8)
    if rank == 0:
        vals[3] = np.nan
    ranks.write(x_io, "float32", vals)
    finding = group.all_reduce(x, nan_check="on")
    assert finding.nonfinite_ranks == 1, finding
    assert finding.nonfinite_count == (1 if rank == 0 else 0), finding
    return group.member_pids


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_match_float64_reference(daemon, job, world):
    checked = ranks.run(collectives, world, daemon.runtime_dir, job)
    # sum, avg, min, max, product of float32; 4 ops of fp16 and bf16; 7 of each integer type;
    # all_gather and reduce_scatter of each of the 5 types.
    assert checked == [5 + 4 + 4 + 7 + 7 + 2 * 5] * world


@pytest.mark.parametrize("world", [2, 3])
def test_coalesced_offsets_barrier_nan(daemon, job, world):
    pids = ranks.run(coalesced_and_offsets, world, daemon.runtime_dir, job)
    assert all(len(p) == world for p in pids)
    assert pids[0] == pids[-1]


def described(client, rank, world):
    """A group described "tp" whose all-reduce passes cuda_stream (ignored for host memory);
    returns the group's description as the daemon lists it."""
    group = client.join_group("described", rank, world, timeout=60.0, description="tp",
                              device="host")
    buf = group.allocate_symmetric(8 * world)
    view, io = ranks.views(buf, "float32", 4)
    ranks.write(io, "float32", np.ones(4))
    group.all_reduce(view, cuda_stream=0)
    assert list(ranks.read(io, "float32")) == [world] * 4
    listed = {g["name"]: g["description"] for g in client.groups()}
    group.barrier()  # every rank listed the group before any leaves it
    return listed["described"]


def test_a_description_reaches_the_daemon_and_bad_ones_are_refused(daemon, client):
    import commd

    assert ranks.run(described, 2, daemon.runtime_dir, client.job_id) == ["tp", "tp"]
    with pytest.raises(commd.InvalidArgumentError,
                       match=r"\(100000 bytes\) is longer than 63 bytes .*allowed 0 to 63"):
        client.join_group("long", 0, 1, description="d" * 100000)
    with pytest.raises(commd.InvalidArgumentError, match="device 'gpu0'; allowed 'host' or"):
        client.join_group("dev", 0, 1, device="gpu0")
    assert client.groups() == []


def test_the_limits_the_binding_states_are_the_daemons(daemon, client):
    """commd.MAX_GROUP_DESCRIPTION_BYTES, the NaN sample period's range and
    MAX_GLOBAL_WORLD_SIZE (commd/limits.h, as the binding exposes them) are where the daemon
    draws its lines."""
    import commd

    longest = "d" * commd.MAX_GROUP_DESCRIPTION_BYTES
    group = client.join_group("longest", 0, 1, description=longest)
    assert {g["name"]: g["description"] for g in client.groups()}["longest"] == longest
    with pytest.raises(commd.InvalidArgumentError,
                       match=f"is longer than {commd.MAX_GROUP_DESCRIPTION_BYTES} bytes"):
        client.join_group("longer", 0, 1, description=longest + "d")
    with pytest.raises(commd.InvalidArgumentError,
                       match=(f"allowed 0 \\(the daemon's\\) or {commd.MIN_NAN_SAMPLE_PERIOD} "
                              f"to {commd.MAX_NAN_SAMPLE_PERIOD}")):
        client.join_group("sampled", 0, 1, nan_check="sampled",
                          nan_sample_period=commd.MAX_NAN_SAMPLE_PERIOD + 1)
    sampled = client.join_group("sampled", 0, 1, nan_check="sampled",
                                nan_sample_period=commd.MAX_NAN_SAMPLE_PERIOD)
    with pytest.raises(commd.InvalidArgumentError,
                       match=f"to {commd.MAX_GLOBAL_WORLD_SIZE} \\(a group spanning nodes\\)"):
        client.join_group("wide", 0, 1, global_rank=0,
                          global_world_size=commd.MAX_GLOBAL_WORLD_SIZE + 1)
    del sampled, group
