"""The fused matmuls through the binding (Group.all_gather_matmul, matmul_reduce_scatter) on
real rank processes, against numpy's float64 all-gather-then-matmul and matmul-then-sum; and
the arguments they refuse."""

from __future__ import annotations

import numpy as np
import pytest

import ranks


def operand(rank: int, tag: int, shape) -> np.ndarray:
    """Small integers / 4: exact in float16 and bfloat16 too."""
    i = np.arange(int(np.prod(shape)))
    return ((((i * 7 + rank * 5 + tag * 3) % 9) - 4) / 4.0).reshape(shape)


def as_type(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # its bits, numpy having no bfloat16
        return (np.ascontiguousarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.ascontiguousarray(values, {"float32": np.float32, "float16": np.float16}[dtype])


def from_type(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def fused(client, rank, world):
    group = client.join_group("f", rank, world, timeout=60.0)
    rows, k, n1, n2 = 6, 11, 5, 3
    shard_buf = group.allocate_symmetric(1 << 16)
    workspace = group.allocate_symmetric(1 << 16)
    checked = 0
    for dtype in ["float32", "float16", "bfloat16"]:
        # A's shard [2, 3, k] flattened to 6 rows, its [2, 3] row scales with it.
        shards = [operand(r, 1, (rows, k)) for r in range(world)]
        bs = [operand(rank, 2, (k, n1)), operand(rank, 3, (k, n2))]
        row_scale = np.array([1.0 + 0.5 * (i % 3) for i in range(rows)], np.float32)
        col_scale = np.array([0.5 if j % 2 == 0 else 1.0 for j in range(n1)], np.float32)
        item = 4 if dtype == "float32" else 2
        io = np.asarray(shard_buf.view("uint8", rows * k * item)).view(as_type(shards[0], dtype).dtype)
        io[:] = as_type(shards[rank], dtype).reshape(-1)
        outs = [np.zeros((world * rows, n), as_type(np.zeros(1), dtype).dtype) for n in (n1, n2)]
        gathered = np.zeros((world * rows, k), outs[0].dtype)
        finding = group.all_gather_matmul(shard_buf, rows, k, [as_type(b, dtype) for b in bs],
                                          outs, dtype, row_scale=row_scale,
                                          col_scales=[col_scale, None], gathered=gathered)
        assert not finding
        a_all = np.concatenate(shards)
        all_scales = np.concatenate([row_scale] * world)
        want = [(a_all @ bs[0]) * all_scales[:, None] * col_scale[None, :],
                (a_all @ bs[1]) * all_scales[:, None]]
        for got, w in zip(outs, want):
            np.testing.assert_allclose(from_type(got, dtype), w, rtol=TOL[dtype], atol=1e-6,
                                       err_msg=dtype)
        np.testing.assert_array_equal(from_type(gathered, dtype), a_all)
        # matmul + reduce-scatter: every rank's own A and B; this rank's rows of the mean.
        m = 3 * world
        a_of = [operand(r, 4, (m, k)) for r in range(world)]
        b_of = [operand(r, 5, (k, n1)) for r in range(world)]
        out = np.zeros((3, n1), outs[0].dtype)
        group.matmul_reduce_scatter(as_type(a_of[rank], dtype), m, k, as_type(b_of[rank], dtype),
                                    out, workspace, "avg", dtype)
        total = sum(a @ b for a, b in zip(a_of, b_of)) / world
        np.testing.assert_allclose(from_type(out, dtype), total[rank * 3:(rank + 1) * 3],
                                   rtol=TOL[dtype], atol=1e-6, err_msg=dtype)
        checked += 3
    return checked


def refused(client, rank, world):
    group = client.join_group("f", rank, world, timeout=60.0)
    shard = group.allocate_symmetric(4096)
    workspace = group.allocate_symmetric(4096)
    b, out = np.ones((4, 3), np.float32), np.zeros((2 * world, 3), np.float32)
    messages: list[str] = []
    expect = ranks.refusals(messages)

    expect("not a multiple of k 5",
           lambda: group.all_gather_matmul(shard, 2, 5, [b], [out], "float32"))
    expect("outs[0] holds", lambda: group.all_gather_matmul(
        shard, 4, 4, [b], [np.zeros(3, np.float32)], "float32"))
    expect("1 Bs, 2 outputs", lambda: group.all_gather_matmul(shard, 2, 4, [b], [out, out],
                                                             "float32"))
    expect("rows are not divisible by the world size", lambda: group.matmul_reduce_scatter(
        np.ones((world + 1, 4), np.float32), world + 1, 4, b, out, workspace, "sum", "float32"))
    expect("is not one of float32, float16, bfloat16", lambda: group.all_gather_matmul(
        shard, 2, 4, [np.ones(12, np.int32)], [np.zeros(6 * world, np.int32)], "int32"))
    # The group still works after every refusal.
    group.all_gather_matmul(shard, 2, 4, [b], [out], "float32")
    return messages


@pytest.mark.parametrize("world", [2, 3])
def test_fused_matmuls_match_numpy(daemon, job, world):
    assert ranks.run(fused, world, daemon.runtime_dir, job) == [9] * world


def test_bad_fused_calls_are_refused_clearly(daemon, job):
    messages = ranks.run(refused, 2, daemon.runtime_dir, job)
    print("\n".join(messages[0]))
