"""One rank of a torch.distributed job on backend commd, started by torchrun from the tests
in this folder: `worker.py SCENARIO OUT_DIR [ARGS...]`. Each scenario checks its results in
the rank itself (AssertionError: exit 1) and writes what the test reads back to
OUT_DIR/rank<N>.json."""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import commd
import commd.torch as ct

# Integer-valued inputs keep every sum exact in every dtype (bf16 has 8 bits of mantissa:
# values stay within +-8, sums within +-32 on 4 ranks; int8's within its range); averages and
# products get a tolerance. uint8 and bool take values in [0, 8] (see inputs).
TOLERANCE = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2,
             torch.int32: 0, torch.int64: 0, torch.float64: 1e-12, torch.int8: 0,
             torch.uint8: 0, torch.int16: 0, torch.bool: 0}
DTYPES = list(TOLERANCE)
OPS = {
    "sum": (dist.ReduceOp.SUM, lambda x: x.sum(0)),
    "avg": (dist.ReduceOp.AVG, lambda x: x.mean(0)),
    "min": (dist.ReduceOp.MIN, lambda x: x.min(0).values),
    "max": (dist.ReduceOp.MAX, lambda x: x.max(0).values),
    "product": (dist.ReduceOp.PRODUCT, lambda x: x.prod(0)),
    # Integer and bool types only: on the values as int64 (two's complement, as they are held).
    "band": (dist.ReduceOp.BAND, lambda x: _bitwise(torch.bitwise_and, x)),
    "bor": (dist.ReduceOp.BOR, lambda x: _bitwise(torch.bitwise_or, x)),
    "bxor": (dist.ReduceOp.BXOR, lambda x: _bitwise(torch.bitwise_xor, x)),
}


def _bitwise(fn, x: torch.Tensor) -> torch.Tensor:
    out = x[0].to(torch.int64)
    for row in x[1:]:
        out = fn(out, row.to(torch.int64))
    return out.to(torch.float64)


def FACTORS(x: torch.Tensor) -> torch.Tensor:  # noqa: N802
    """Factors in {-1, 1, 2}: products of up to 4 ranks stay exact in every dtype."""
    r = torch.remainder(x, 3)
    return torch.where(r == 0, -1.0, r)


def reductions(dtype: torch.dtype, everyone: torch.Tensor):
    """For each reduce op `dtype` takes: (name, op, every rank's inputs, their float64
    reduction). AVG is for floating types only; PRODUCT gets inputs whose products stay exact
    (uint8 and bool: their own non-negative inputs, products wrapping as check expects)."""
    for name, (op, reduce) in OPS.items():
        if name == "avg" and not dtype.is_floating_point:
            continue
        if name in ("band", "bor", "bxor") and dtype.is_floating_point:
            continue
        x = everyone if name != "product" or not dtype.is_signed else FACTORS(everyone)
        if name in ("band", "bor", "bxor") and dtype == torch.bool:
            x = (everyone != 0).to(torch.float64)  # the bits bool holds: 0 or 1
        yield name, op, x, reduce(x)


def inputs(rank: int, n: int, dtype: torch.dtype | None = None, low: int = -8,
           high: int = 8) -> torch.Tensor:
    """Rank `rank`'s n values in [low, high]; [0, high] for uint8 and bool, whose reductions of
    non-negative values are those of the values they hold (bool: nonzero is true, so sum is
    or, min and, max or)."""
    if dtype is not None and not dtype.is_signed:
        low = 0
    i = torch.arange(n, dtype=torch.float64)
    return torch.remainder(i * 7 + rank * 3, high - low + 1) + low


def held(want: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float64 reference as `dtype` holds it: bool is nonzero, narrow integers wrap."""
    if dtype == torch.bool:
        return (want != 0).to(torch.float64)
    if dtype.is_floating_point or dtype.itemsize == 8:
        return want
    m = float(1 << (8 * dtype.itemsize))
    w = torch.remainder(want, m)
    return torch.where(w >= m / 2, w - m, w) if dtype.is_signed else w


def check(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.to(torch.float64), held(want, dtype), rtol=tol, atol=tol,
                               msg=lambda m: f"{what}: {m}")


def write(out_dir: str, value, name: str | None = None) -> None:
    """Writes OUT_DIR/<name or rank<N>>.json whole or not at all: the tests may read it the
    moment it exists. RANK is torchrun's: it is there before the process group is."""
    path = os.path.join(out_dir, f"{name or 'rank' + os.environ['RANK']}.json")
    with open(path + ".part", "w") as f:
        json.dump(value, f)
    os.replace(path + ".part", path)


# More elements than one 1 MiB staging buffer (the tests' COMMD_TORCH_CHUNK_BYTES) holds in
# every dtype: 1.5 MiB of 16-bit values, 3 MiB of 32-bit ones, 6 MiB of int64; all-gathers,
# reduce-scatters and all-to-alls take world_size pieces of that per chunk.
LARGE = (3 << 20) // 4 + 5


def other_collectives(rank: int, world: int, n: int, dtype: torch.dtype) -> int:
    """all_gather (list and into a tensor), reduce_scatter (list and tensor), broadcast and
    all_to_all_single of `n` elements a rank against float64 references; returns how many."""
    everyone = torch.stack([inputs(r, n, dtype) for r in range(world)])
    t = inputs(rank, n, dtype).to(dtype)
    outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
    dist.all_gather(outs, t)
    check(torch.stack(outs), everyone, dtype, f"all_gather {dtype} n={n}")
    out = torch.empty(world * n, dtype=dtype)
    dist.all_gather_into_tensor(out, t)
    check(out, everyone.reshape(-1), dtype, f"all_gather_into_tensor {dtype} n={n}")
    # Rank r's block c is inputs(r * world + c); this rank's sum is over its block of each.
    big = torch.stack([inputs(rank * world + c, n, dtype) for c in range(world)])
    want = torch.stack([inputs(r * world + rank, n, dtype) for r in range(world)]).sum(0)
    out = torch.empty(n, dtype=dtype)
    dist.reduce_scatter_tensor(out, big.reshape(-1).to(dtype))
    check(out, want, dtype, f"reduce_scatter_tensor {dtype} n={n}")
    out = torch.empty(n, dtype=dtype)
    dist.reduce_scatter(out, [b.to(dtype) for b in big])
    check(out, want, dtype, f"reduce_scatter {dtype} n={n}")
    t = inputs(rank, n, dtype).to(dtype) if rank == world - 1 else torch.zeros(n, dtype=dtype)
    dist.broadcast(t, src=world - 1)
    check(t, inputs(world - 1, n, dtype), dtype, f"broadcast {dtype} n={n}")
    recv = torch.empty(world * n, dtype=dtype)
    dist.all_to_all_single(recv, big.reshape(-1).to(dtype))
    want = torch.stack([inputs(p * world + rank, n, dtype) for p in range(world)])
    check(recv, want.reshape(-1), dtype, f"all_to_all_single {dtype} n={n}")
    return 6


def non_contiguous(rank: int, world: int) -> int:
    """Non-contiguous tensors larger than a staging buffer: staged through a contiguous copy
    in chunks and written back, what lies between their elements untouched."""
    # all_reduce of a transposed 1024 x 1031 float32 (4 MiB).
    rows, cols = 1024, 1031
    t = inputs(rank, rows * cols).reshape(rows, cols).to(torch.float32).t()
    dist.all_reduce(t)
    want = torch.stack([inputs(r, rows * cols) for r in range(world)]).sum(0)
    check(t, want.reshape(rows, cols).t(), torch.float32, "all_reduce of a large transpose")
    # broadcast into every other element of a bfloat16 tensor (1.5 MiB of them).
    n = LARGE
    base = torch.full((2 * n,), 100.0, dtype=torch.bfloat16)
    t = base[::2]
    if rank == 0:
        t.copy_(inputs(0, n))
    dist.broadcast(t, src=0)
    check(t, inputs(0, n), torch.bfloat16, "broadcast into a strided bfloat16 tensor")
    check(base[1::2], torch.full((n,), 100.0, dtype=torch.float64), torch.bfloat16,
          "the elements between the broadcast's")
    # all_gather of a transposed int64 input into transposed outputs (6 MiB each).
    rows, cols = 768, 1025
    t = inputs(rank, rows * cols).reshape(rows, cols).to(torch.int64).t()
    outs = [torch.empty(rows, cols, dtype=torch.int64).t() for _ in range(world)]
    dist.all_gather(outs, t)
    for r, o in enumerate(outs):
        check(o, inputs(r, rows * cols).reshape(rows, cols).t(), torch.int64,
              f"all_gather of a large transpose, rank {r}'s")
    # reduce_scatter_tensor from every other element of a float16 input.
    n = LARGE
    base = torch.zeros(2 * world * n, dtype=torch.float16)
    src = base[1::2]
    src.copy_(torch.cat([inputs(rank * world + c, n) for c in range(world)]))
    out = torch.empty(2 * n, dtype=torch.float16)[::2]
    dist.reduce_scatter_tensor(out, src, op=dist.ReduceOp.MAX)
    want = torch.stack([inputs(r * world + rank, n) for r in range(world)]).max(0).values
    check(out, want, torch.float16, "reduce_scatter_tensor of strided float16 tensors")
    return 4


def ops_matrix(out_dir: str) -> None:
    """Every collective x dtype x reduce op against a float64 reference, odd sizes and sizes
    that take several staging chunks, non-contiguous tensors, symmetric (zero-copy) tensors."""
    rank, world = dist.get_rank(), dist.get_world_size()
    checked = 0
    for n in (1, 1001, LARGE):
        for dtype in DTYPES:
            everyone = torch.stack([inputs(r, n, dtype) for r in range(world)])
            for name, op, x, want in reductions(dtype, everyone):
                t = x[rank].to(dtype, copy=True)  # reduced in place: never x itself
                dist.all_reduce(t, op=op)
                check(t, want, dtype, f"all_reduce {dtype} {name} n={n}")
                checked += 1
            checked += other_collectives(rank, world, n, dtype)
    # Non-contiguous: a small transposed view reduces in place, and large ones of each kind.
    t = inputs(rank, 6 * 7).reshape(6, 7).to(torch.float32).t()
    dist.all_reduce(t)
    want = torch.stack([inputs(r, 42) for r in range(world)]).sum(0).reshape(6, 7).t()
    check(t, want, torch.float32, "all_reduce of a transposed tensor")
    checked += non_contiguous(rank, world)
    # Symmetric tensors: the zero-copy path.
    s = ct.empty((1001,), dtype=torch.float32)
    s.copy_(inputs(rank, 1001))
    dist.all_reduce(s)
    check(s, torch.stack([inputs(r, 1001) for r in range(world)]).sum(0), torch.float32,
          "all_reduce of a commd.torch.empty tensor")
    # async_op: a Work that is complete when returned.
    t = torch.ones(5)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait() is True
    assert work.get_future().wait()[0].eq(world).all()
    # A subgroup of the even ranks.
    evens = list(range(0, world, 2))
    sub = dist.new_group(evens)
    if rank in evens:
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=sub)
        check(t, torch.full((3,), float(sum(evens)), dtype=torch.float64), torch.float32,
              "all_reduce on new_group")
    dist.barrier()
    write(out_dir, {"checked": checked + 4})


def coalesced(out_dir: str) -> None:
    """dist._coalescing_manager: one commd coalesced all-reduce for the block."""
    rank, world = dist.get_rank(), dist.get_world_size()
    a, b = torch.full((3,), float(rank)), torch.full((1000,), 1.0)
    dist.barrier()
    with dist._coalescing_manager():
        dist.all_reduce(a)
        dist.all_reduce(b)
    assert a.eq(sum(range(world))).all() and b.eq(world).all(), (a, b)
    # With a device torch also calls start/end_coalescing, and pairs of all_gather_into_tensor
    # and reduce_scatter_tensor go to the coalesced pair calls.
    gathered = [torch.empty(2 * world), torch.empty(3 * world)]
    scattered = [torch.empty(2), torch.empty(3)]
    with dist._coalescing_manager(device=torch.device("cpu")):
        dist.all_gather_into_tensor(gathered[0], torch.full((2,), float(rank)))
        dist.all_gather_into_tensor(gathered[1], torch.full((3,), float(rank)))
    with dist._coalescing_manager(device=torch.device("cpu")):
        for s in scattered:
            dist.reduce_scatter_tensor(s, torch.ones(s.numel() * world))
    for g, n in zip(gathered, (2, 3)):
        assert g.view(world, n).eq(torch.arange(world).view(world, 1)).all(), g
    assert all(s.eq(world).all() for s in scattered), scattered
    # Tensors that do not fit the staging buffer together: one all-reduce each, in chunks,
    # all of them parts of the block's one entry.
    large = [inputs(rank, LARGE).float(), torch.full((7,), float(rank))]
    with dist._coalescing_manager():
        for t in large:
            dist.all_reduce(t)
    everyone = torch.stack([inputs(r, LARGE) for r in range(world)])
    check(large[0], everyone.sum(0), torch.float32, "coalesced beyond the staging buffer")
    check(large[1], torch.full((7,), float(sum(range(world))), dtype=torch.float64),
          torch.float32, "coalesced beyond the staging buffer, second tensor")
    dist.barrier()
    # This rank's flight recorder, as the daemon dumps it.
    entries = _entries(rank)
    write(out_dir, {"entries": [[e["profiling_name"], e["input_sizes"], e["output_sizes"],
                                 e["state"]] for e in entries],
                    "large": LARGE,
                    "process_groups": sorted({tuple(e["process_group"]) for e in entries})})


def ddp(out_dir: str, steps: str) -> None:
    """The same small model trained by DDP over commd and over gloo from the same start."""
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    params = {}
    smallest_step = 0.0
    for name, group in (("commd", None), ("gloo", gloo)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        ddp_model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(100 + rank)
        moves = []  # each step's largest change of a parameter
        for _ in range(int(steps)):
            x = torch.randn(8, 16, generator=data)
            y = torch.randn(8, 4, generator=data)
            before = [p.detach().clone() for p in model.parameters()]
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp_model(x), y).backward()
            opt.step()
            moves.append(max((p.detach() - b).abs().max().item()
                             for p, b in zip(model.parameters(), before)))
        params[name] = [p.detach().clone() for p in model.parameters()]
        smallest_step = min(moves) if name == "commd" else smallest_step
    for c, g in zip(params["commd"], params["gloo"]):
        # Both average the same gradients; the sums' order may differ, so bits may
        # (docs/torch.md, "DDP against gloo": the tolerance and why).
        torch.testing.assert_close(c, g, rtol=1e-5, atol=1e-6)
    diff = max((c - g).abs().max().item() for c, g in zip(params["commd"], params["gloo"]))
    write(out_dir, {"parameters": sum(p.numel() for p in params["commd"]),
                    "max_abs_difference": diff, "smallest_step": smallest_step,
                    "largest_parameter": max(p.abs().max().item() for p in params["commd"])})


def fsdp(out_dir: str) -> None:
    """FSDP2 (fully_shard) over a commd mesh and over a gloo one, from the same start, reach
    the same parameters; a functional collective on the default group."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import torch.distributed._functional_collectives as fc

    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    params = {}
    for name, mesh in (("commd", init_device_mesh("cpu", (world,))),
                       ("gloo", DeviceMesh.from_group(gloo, "cpu"))):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(100 + rank)
        for _ in range(5):
            x = torch.randn(8, 16, generator=data)
            y = torch.randn(8, 4, generator=data)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        params[name] = [p.full_tensor().detach().clone() for p in model.parameters()]
    for c, g in zip(params["commd"], params["gloo"]):
        torch.testing.assert_close(c, g, rtol=1e-5, atol=1e-6)
    t = fc.all_reduce(torch.full((4,), float(rank)), "sum", dist.group.WORLD)
    assert torch.as_tensor(fc.wait_tensor(t)).eq(sum(range(world))).all()
    write(out_dir, {"parameters": sum(p.numel() for p in params["commd"])})


def _expect_failure(out_dir: str, fn, timed: bool = False) -> None:
    """Runs `fn`, which must raise DistBackendError, and writes what it raised (with `timed`,
    also when: the wall clock's time, which the test compares with other processes')."""
    try:
        fn()
    except dist.DistBackendError as e:
        cause = e.__cause__
        result = {"raised": type(e).__name__, "message": str(e),
                  "cause": type(cause).__name__ if cause else None,
                  "code": getattr(cause, "code", None)}
        if timed:
            result["raised_at"] = time.time()
        write(out_dir, result)
        return
    write(out_dir, {"raised": None})


def hang(out_dir: str) -> None:
    """The last rank never calls the all-reduce; the watchdog (policy notify) diagnoses the
    hang and the others' pending call raises."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        deadline = time.monotonic() + 60
        group = ct.backend_of().commd_group
        while not group.abort_requested and time.monotonic() < deadline:
            time.sleep(0.1)
        write(out_dir, {"abort_reason": group.abort_reason})
        return
    _expect_failure(out_dir, lambda: dist.all_reduce(torch.ones(4)))


def nan(out_dir: str) -> None:
    """NaN policy fail: a NaN on rank 0 fails the all-reduce on every rank."""
    t = torch.ones(64)
    if dist.get_rank() == 0:
        t[17] = float("nan")
    _expect_failure(out_dir, lambda: dist.all_reduce(t))


def death(out_dir: str) -> None:
    """The last rank dies (SIGKILL) after 3 steps, writing the time to OUT_DIR/killed.json
    first; the others raise naming it, with the time they did."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1024)
    # torchrun's agent ends a failed worker's node-mates with SIGTERM (then SIGKILL 30 s
    # later): a survivor that has not raised yet when its agent notices the death would end
    # without its result. What is tested is the daemon's abort, so the survivors finish first.
    signal.signal(signal.SIGTERM, lambda *_: None)

    def train():
        for step in range(1000):
            if rank == world - 1 and step == 3:
                write(out_dir, {"killed_at": time.time()}, name="killed")
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t)

    _expect_failure(out_dir, train, timed=True)


def bad_arguments(out_dir: str) -> None:
    """What each bad argument raises; the group stays usable after the local checks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    seen = {}
    for name, fn, kind in (
        ("uint16", lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint16)), TypeError),
        ("mixed devices", lambda: dist.all_gather(
            [torch.empty(3)] * (world - 1) + [torch.empty(3, device="meta")], torch.ones(3)),
         ValueError),
        ("mixed dtypes", lambda: dist.all_gather(
            [torch.empty(3, dtype=torch.int32) for _ in range(world)], torch.ones(3)),
         ValueError),  # torch's own check
        ("wrong output size", lambda: dist.all_gather_into_tensor(
            torch.empty(3 * world + 1), torch.ones(3)), ValueError),
        ("bad splits", lambda: dist.all_to_all_single(
            torch.empty(world * 2), torch.ones(world * 2),
            output_split_sizes=[1] * world, input_split_sizes=[2] * world), ValueError),
        ("short gather list", lambda: ct.backend_of().gather(
            [[torch.empty(3)] * (world + 1)], [torch.ones(3)], _rooted(dist.GatherOptions(), rank)),
         ValueError),
        ("negative tag", lambda: dist.send(torch.ones(1), (rank + 1) % world, tag=-1),
         dist.DistBackendError),
        ("bitwise and of floats", lambda: dist.all_reduce(torch.ones(3),
                                                          op=dist.ReduceOp.BAND), TypeError),
    ):
        try:
            fn()
        except kind as e:
            seen[name] = str(e)
        except Exception as e:
            raise AssertionError(f"{name}: {type(e).__name__} instead of {kind.__name__}: "
                                 f"{e}") from e
        else:
            raise AssertionError(f"{name}: no {kind.__name__}")
    t = torch.ones(4)
    dist.all_reduce(t)  # still usable
    assert t.eq(world).all()
    # Sizes that differ across ranks: the cross-rank call check fails it on every rank.
    _expect_failure(out_dir, lambda: dist.all_reduce(torch.ones(10 + rank)))
    with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
        seen_mismatch = json.load(f)
    write(out_dir, {"local": seen, "mismatch": seen_mismatch})


def _rooted(opts, root: int):
    opts.rootRank = root
    return opts


def rooted_and_objects(out_dir: str) -> None:
    """What real programs call beyond the all-rank collectives: reduce, gather and scatter
    from every root, all_gather_coalesced, list and uneven all-to-all, the object
    collectives, and a torch.distributed.checkpoint save and load."""
    rank, world = dist.get_rank(), dist.get_world_size()
    checked = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool):
        everyone = torch.stack([inputs(r, 1001, dtype) for r in range(world)])
        for root in range(world):
            for name, op, x, want in reductions(dtype, everyone):
                t = x[rank].to(dtype, copy=True)
                before = t.clone()
                dist.reduce(t, dst=root, op=op)
                if rank == root:
                    check(t, want, dtype, f"reduce {dtype} {name} to {root}")
                else:
                    assert torch.equal(t, before), f"reduce {dtype} {name}: non-root changed"
                checked += 1
            mine = everyone[rank].to(dtype)
            gathered = [torch.empty(1001, dtype=dtype) for _ in range(world)] if rank == root \
                else None
            dist.gather(mine, gathered, dst=root)
            if rank == root:
                check(torch.stack(gathered), everyone, dtype, f"gather {dtype} to {root}")
            out = torch.empty(1001, dtype=dtype)
            blocks = [inputs(root * world + p, 1001, dtype).to(dtype) for p in range(world)]
            dist.scatter(out, blocks if rank == root else None, src=root)
            check(out, inputs(root * world + rank, 1001, dtype), dtype,
                  f"scatter {dtype} from {root}")
            checked += 2
    # all_gather_coalesced: outputs[r][j] is rank r's input j.
    ins = [inputs(rank, 5).to(torch.float64), inputs(rank + 1, 3).to(torch.float64)]
    outs = [[torch.empty(5, dtype=torch.float64), torch.empty(3, dtype=torch.float64)]
            for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(world):
        check(outs[r][0], inputs(r, 5), torch.float64, f"all_gather_coalesced rank {r} 0")
        check(outs[r][1], inputs(r + 1, 3), torch.float64, f"all_gather_coalesced rank {r} 1")
    checked += 1
    # Uneven all-to-all: rank r sends r + p + 1 rows of 3 to rank p (and none to itself on
    # rank 0), the sizes a mixture-of-experts layer's routing makes.
    def rows(src: int, dst: int) -> int:
        return 0 if src == dst == 0 else src + dst + 1

    def block(src: int, dst: int) -> torch.Tensor:
        return inputs(src * world + dst, rows(src, dst) * 3).reshape(-1, 3)

    send = torch.cat([block(rank, p) for p in range(world)]).to(torch.int32)
    recv = torch.empty(sum(rows(p, rank) for p in range(world)), 3, dtype=torch.int32)
    dist.all_to_all_single(recv, send, [rows(p, rank) for p in range(world)],
                           [rows(rank, p) for p in range(world)])
    check(recv, torch.cat([block(p, rank) for p in range(world)]), torch.int32,
          "uneven all_to_all_single")
    outs = [torch.empty(rows(p, rank), 3, dtype=torch.int32) for p in range(world)]
    dist.all_to_all(outs, [block(rank, p).to(torch.int32) for p in range(world)])
    for p in range(world):
        check(outs[p], block(p, rank), torch.int32, f"all_to_all list from {p}")
    checked += 2
    # The object collectives (pickles as uint8 tensors, sizes as int64).
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "text": "x" * (rank * 100)})
    assert objs == [{"rank": r, "text": "x" * (r * 100)} for r in range(world)], objs
    sent = [{"step": 7, "world": world}, list(range(rank + 3))]
    dist.broadcast_object_list(sent, src=world - 1)
    assert sent == [{"step": 7, "world": world}, list(range(world + 2))], sent
    got = [None] * world if rank == 0 else None
    dist.gather_object(("from", rank), got, dst=0)
    if rank == 0:
        assert got == [("from", r) for r in range(world)], got
    mine = [None]
    dist.scatter_object_list(mine, [f"to {r}" for r in range(world)] if rank == 0 else None,
                             src=0)
    assert mine == [f"to {rank}"], mine
    checked += 4
    # torch.distributed.checkpoint: each rank saves its shard, loads it back into zeros.
    import torch.distributed.checkpoint as dcp
    state = {"weight": torch.arange(12, dtype=torch.float32) + rank,
             "step": torch.tensor(5 + rank)}
    path = os.path.join(out_dir, "checkpoint")
    dcp.save({f"rank{rank}": state}, checkpoint_id=path)
    loaded = {f"rank{rank}": {k: torch.zeros_like(v) for k, v in state.items()}}
    dcp.load(loaded, checkpoint_id=path)
    assert all(torch.equal(loaded[f"rank{rank}"][k], v) for k, v in state.items()), loaded
    checked += 1
    write(out_dir, {"checked": checked})


def point_to_point(out_dir: str) -> None:
    """send/recv, isend/irecv and batch_isend_irecv (a ring of isends posted before their
    irecvs) of every dtype and of sizes from nothing to several 1 MiB staging pieces, tags,
    non-contiguous tensors, a Work's future, monitored_barrier; then a
    torch.distributed.pipelining GPipe schedule, one stage a rank, whose losses and gradients
    equal the same schedule's over gloo; last, a monitored barrier the other ranks miss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    checked = 0
    for dtype in DTYPES:
        for n in (0, 1, 1001) + (((1 << 19) + 3,) if dtype == torch.float32 else ()):
            out = inputs(rank, n, dtype).to(dtype)
            got = torch.empty(n, dtype=dtype)
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt),
                                             dist.P2POp(dist.irecv, got, prev)]):
                w.wait()
            assert torch.equal(got, inputs(prev, n, dtype).to(dtype)), (dtype, n)
            checked += 1
    # Rank 0 sends each rank a transposed (non-contiguous) matrix on the rank's own tag, the
    # last one first; each receives into a transposed view. A Work's future completes.
    if rank == 0:
        works = [dist.isend((torch.arange(12.0).view(3, 4) + r).t(), dst=r, tag=r)
                 for r in reversed(range(1, world))]
        torch.futures.wait_all([w.get_future() for w in works])
        assert all(w.is_completed() for w in works)
    else:
        into = torch.zeros(3, 4).t()
        dist.recv(into, src=0, tag=rank)
        assert torch.equal(into, (torch.arange(12.0).view(3, 4) + rank).t()), into
    checked += 1
    # Receives from any source: rank 0 takes one message of every other rank (tag 5), each
    # sent after a sleep in reverse rank order so that the later ranks come first; torch's
    # recv returns the sender, and each message is that sender's.
    if rank == 0:
        senders = []
        for _ in range(world - 1):
            t = torch.zeros(3, dtype=torch.int64)
            src = dist.recv(t, tag=5)
            assert torch.equal(t, torch.full((3,), src * 100, dtype=torch.int64)), (src, t)
            senders.append(src)
        assert sorted(senders) == list(range(1, world)), senders
    else:
        time.sleep(0.2 * (world - rank))
        dist.send(torch.full((3,), rank * 100, dtype=torch.int64), dst=0, tag=5)
    checked += 1
    # monitored_barrier, gloo's semantics on the point-to-point channels.
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60), wait_all_ranks=True)
    checked += 1
    # Pipeline parallelism: the same stages, inputs and schedule over commd and over gloo.
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    gloo = dist.new_group(backend="gloo")
    results = {}
    for name, group in (("commd", None), ("gloo", gloo)):
        torch.manual_seed(0)
        stages = [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())
                  for _ in range(world)]
        stage = PipelineStage(stages[rank], rank, world, torch.device("cpu"), group=group)
        schedule = ScheduleGPipe(stage, n_microbatches=4,
                                 loss_fn=lambda y, t: torch.nn.functional.mse_loss(y, t))
        x, target = torch.randn(8, 16), torch.randn(8, 16)
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=target, losses=losses)
        else:
            schedule.step()
        results[name] = ([p.grad.clone() for p in stages[rank].parameters()], losses)
    for c, g in zip(results["commd"][0], results["gloo"][0]):
        assert torch.equal(c, g), (c - g).abs().max()
    assert [float(v) for v in results["commd"][1]] == [float(v) for v in results["gloo"][1]]
    assert rank != world - 1 or len(results["commd"][1]) == 4
    # A monitored barrier only rank 0 enters names every other rank, as gloo's does.
    missed = None
    if rank == 0:
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=True)
        except RuntimeError as e:
            missed = str(e)
    dist.barrier()
    write(out_dir, {"checked": checked + 1, "losses": [float(v) for v in results["commd"][1]],
                    "missed": missed})


def _entries(rank: int) -> list:
    """This rank's flight-recorder entries of the default group, as the daemon dumps them."""
    dump = ct.backend_of().client.dump(group=ct.backend_of().commd_group.name)
    path = [f for f in dump["files"] if f.endswith(f"/rank{rank}.json")][0]
    with open(path) as f:
        return json.load(f)["entries"]


def zero_copy(out_dir: str) -> None:
    """Collectives on commd.torch.empty tensors: which backend ran them (the C++ one's
    counters, when it is the process group's backend), their results for every dtype and
    reduce op against a float64 reference, async_op Works, the flight-recorder entries, and
    what sizes that differ across ranks raise."""
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    cpp = not isinstance(backend, ct.ProcessGroupCommd)

    def calls():
        return (backend.zero_copy_calls, backend.forwarded_calls) if cpp else (0, 0)

    start = calls()
    entries_before = len(_entries(rank))
    checked = taken = 0  # collectives checked, and those the C++ path should take
    for n in (1, 1001):
        for dtype in DTYPES:
            everyone = torch.stack([inputs(r, n, dtype) for r in range(world)])
            for name, op, x, want in reductions(dtype, everyone):
                t = ct.empty((n,), dtype=dtype)
                t.copy_(x[rank])
                dist.all_reduce(t, op=op)
                check(t, want, dtype, f"zero-copy all_reduce {dtype} {name} n={n}")
                checked += 1
                taken += 1  # every reduce op, the SDK's kernels' own
            t = ct.empty((n,), dtype=dtype)
            t.copy_(inputs(rank, n, dtype) if rank == world - 1 else torch.zeros(n))
            dist.broadcast(t, src=world - 1)
            check(t, inputs(world - 1, n, dtype), dtype, f"zero-copy broadcast {dtype}")
            src, out = ct.empty((n,), dtype=dtype), ct.empty((world * n,), dtype=dtype)
            src.copy_(inputs(rank, n, dtype))
            dist.all_gather_into_tensor(out, src)
            check(out, everyone.reshape(-1), dtype, f"zero-copy all_gather_into_tensor {dtype}")
            big, out = ct.empty((world * n,), dtype=dtype), ct.empty((n,), dtype=dtype)
            parts = torch.stack([inputs(rank * world + c, n, dtype) for c in range(world)])
            big.copy_(parts.reshape(-1))
            dist.reduce_scatter_tensor(out, big, op=dist.ReduceOp.MAX)
            want = torch.stack([
                torch.stack([inputs(r * world + c, n, dtype) for c in range(world)])
                for r in range(world)]).max(0).values[rank]
            check(out, want, dtype, f"zero-copy reduce_scatter_tensor {dtype}")
            checked += 3
            taken += 3
    # A tensor that does not start its buffer: the Python backend stages it.
    t = ct.empty((8,))
    t.fill_(1.0)
    tail = t[1:]
    dist.all_reduce(tail)
    assert tail.eq(world).all() and t[0].item() == 1.0, t
    # async_op: a Work complete when returned, its future holding the tensor itself.
    t = ct.empty((5,))
    t.fill_(float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    if cpp:
        # Complete when returned, as torch documents is_completed for CPU collectives (the
        # Python backend alone cannot say so: torch's holder of its Work; see work()).
        assert work.is_completed()
        assert work.result()[0].data_ptr() == t.data_ptr()  # the Python one's raises
    assert work.wait() is True
    assert work.exception() is None
    result = work.get_future().wait()
    assert len(result) == 1 and result[0].data_ptr() == t.data_ptr(), result
    assert t.eq(world * (world + 1) / 2).all(), t
    checked += 1
    taken += 1
    gathered = ct.empty((2 * world,))
    src = ct.empty((2,))
    src.fill_(float(rank))
    work = dist.all_gather_into_tensor(gathered, src, async_op=True)
    assert work.wait() is True and (work.is_completed() or not cpp)
    assert work.get_future().wait().data_ptr() == gathered.data_ptr()
    assert gathered.view(world, 2).eq(torch.arange(world).view(world, 1)).all(), gathered
    taken += 1
    end = calls()
    # One flight-recorder entry per collective: every zero-copy call and the staged one.
    entries = [[e["profiling_name"], e["input_sizes"], e["output_sizes"], e["process_group"],
                e["state"]] for e in _entries(rank)[entries_before:]]
    # Sizes that differ across ranks on zero-copy tensors: the SDK's cross-rank call check.
    t = ct.empty((16,))
    _expect_failure(out_dir, lambda: dist.all_reduce(t[:10 + rank]))
    with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
        mismatch = json.load(f)
    hooks = getattr(dist.distributed_c10d._world, "pg_flight_recorder_hooks", None)
    write(out_dir, {"cpp": cpp, "zero_copy_calls": end[0] - start[0],
                    "torch_fr_hook": None if hooks is None else dist.group.WORLD in hooks,
                    "forwarded_calls": end[1] - start[1], "taken": taken,
                    "checked": checked, "entries": entries, "mismatch": mismatch,
                    "after_mismatch": calls()[0] - end[0]})


def work(out_dir: str) -> None:
    """The Work of an async_op call, as torch documents it, on a staged tensor, a zero-copy
    one, an all_gather_into_tensor and a barrier: is_completed() (non-blocking; True once the
    operation finished, which a host collective has when the call returns), wait() True,
    exception() None, get_future() done and holding the outputs, result() the outputs; a
    failure raised from the call; a DDP comm hook (get_future().then) training as DDP's own
    all-reduce does. With the Python backend alone torch's holder of a Python backend's Work
    answers is_completed() False and result() raises (docs/torch.md, "Work")."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    cpp = not isinstance(backend, ct.ProcessGroupCommd)
    completes = cpp  # what is_completed() says of a finished operation
    checked = 0

    def check_work(w, outputs: list[torch.Tensor], what: str) -> None:
        nonlocal checked
        assert w.is_completed() is completes, (what, w.is_completed())
        assert w.wait() is True, what
        assert w.wait(timeout=datetime.timedelta(seconds=1)) is True, what
        assert w.is_completed() is completes, what
        assert w.exception() is None, what
        fut = w.get_future()
        assert fut.done(), what
        value = fut.wait()
        got = value if isinstance(value, list) else [] if value is None else [value]
        assert [t.data_ptr() for t in got] == [t.data_ptr() for t in outputs], (what, got)
        if cpp:
            assert [t.data_ptr() for t in w.result()] == [t.data_ptr() for t in outputs], what
        else:
            try:
                w.result()
                raise AssertionError(f"{what}: result() of the Python backend's Work returned")
            except RuntimeError as e:
                assert "not implemented" in str(e), (what, e)
        checked += 1

    staged = torch.full((3000,), float(rank + 1))
    w = dist.all_reduce(staged, async_op=True)
    check_work(w, [staged], "staged all_reduce")
    assert staged.eq(world * (world + 1) / 2).all(), staged
    zero = ct.empty((5,))
    zero.fill_(float(rank + 1))
    w = dist.all_reduce(zero, async_op=True)
    check_work(w, [zero], "zero-copy all_reduce")
    assert zero.eq(world * (world + 1) / 2).all(), zero
    gathered, src = ct.empty((2 * world,)), ct.empty((2,))
    src.fill_(float(rank))
    w = dist.all_gather_into_tensor(gathered, src, async_op=True)
    check_work(w, [gathered], "all_gather_into_tensor")
    assert gathered.view(world, 2).eq(torch.arange(world).view(world, 1)).all(), gathered
    w = dist.barrier(async_op=True)
    check_work(w, [], "barrier")
    # A failure raises from the call (async_op or not), never from a later wait().
    raised = None
    try:
        dist.all_reduce(torch.ones(10 + rank), async_op=True)
    except dist.DistBackendError as e:
        raised = type(e.__cause__).__name__
    assert raised == "InvalidArgumentError", raised
    # DDP's comm hooks get the future of an async all_reduce: the same training as without.
    params = []
    for hook in (None, default_hooks.allreduce_hook):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 2))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(7 + rank)
        for _ in range(3):
            opt.zero_grad()
            loss = ddp(torch.randn(4, 8, generator=data)).square().mean()
            loss.backward()
            opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    write(out_dir, {"cpp": cpp, "checked": checked})


def interrupt(out_dir: str) -> None:
    """Ctrl-C during a zero-copy all-reduce the last rank never joins: rank 0 writes its pid
    and blocks; the test sends it SIGINT. Rank 0 must raise KeyboardInterrupt and leave the
    group aborted; the last rank, once rank 0 is done, finds the group aborted."""
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    cpp = not isinstance(backend, ct.ProcessGroupCommd)
    t = ct.empty((64,))
    group = ct.backend_of().commd_group
    if rank == 0:
        with open(os.path.join(out_dir, "blocked"), "w") as f:
            f.write(str(os.getpid()))
        start = time.monotonic()
        try:
            dist.all_reduce(t)
            result = {"raised": None}
        except KeyboardInterrupt:
            result = {"raised": "KeyboardInterrupt"}
        result.update(seconds=time.monotonic() - start, cpp=cpp,
                      zero_copy_calls=backend.zero_copy_calls if cpp else 0,
                      abort_requested=group.abort_requested, abort_reason=group.abort_reason)
        write(out_dir, result)
        return
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out_dir, "rank0.json")):
        assert time.monotonic() < deadline, "rank 0 never finished"
        time.sleep(0.05)
    _expect_failure(out_dir, lambda: dist.all_reduce(t))


def _operand(rank: int, tag: int, shape) -> torch.Tensor:
    """Quarters in [-1, 1]: exact in every floating type, products exact in float32."""
    n = 1
    for s in shape:
        n *= s
    return (inputs(rank * 31 + tag, n, low=-4, high=4) / 4).reshape(shape)


def fused_matmul(out_dir: str) -> None:
    """commd.torch.fused_all_gather_matmul / fused_matmul_reduce_scatter against the unfused
    float64 reference, every dtype, gather/scatter along dim 0 and 1 of a 3-D A, row-wise
    (reshaped with A) and column-wise scales; then a tensor-parallel nn.Linear pair."""
    rank, world = dist.get_rank(), dist.get_world_size()
    checked = 0
    # A shard already in commd memory (commd.torch.empty) is multiplied in place: no copy.
    sym = ct.empty((2, 3, 16))
    sym.copy_(_operand(rank, 6, (2, 3, 16)))
    b0 = _operand(rank, 7, (16, 4))
    _, (got,) = ct.fused_all_gather_matmul(sym, [b0.float()], 0, return_A=False)
    check(got, torch.cat([_operand(r, 6, (2, 3, 16)) for r in range(world)]) @ b0,
          torch.float32, "in-place shard")
    assert 0 not in ct.backend_of()._fused, "the shard was copied into the backend's buffer"
    checked += 1
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for dim in (0, 1):
            shards = [_operand(r, 1, (2, 3, 16)) for r in range(world)]
            bs = [_operand(rank, 2, (16, 5)), _operand(rank, 3, (16, 7))]
            a_scale = 1 + (torch.arange(6, dtype=torch.float64) % 3).reshape(2, 3, 1) / 2
            b_scale = torch.tensor([0.5, 1.0] * 2 + [2.0], dtype=torch.float64)
            a_all, outs = ct.fused_all_gather_matmul(
                shards[rank].to(dtype), [b.to(dtype) for b in bs], dim,
                A_scale=a_scale.to(dtype), B_scales=[b_scale, None])
            gathered = torch.cat(shards, dim)
            scales = torch.cat([a_scale] * world, dim)
            check(a_all, gathered, dtype, f"gathered A dim {dim}")
            check(outs[0], (gathered @ bs[0]) * scales * b_scale, dtype, f"A@B0 dim {dim}")
            check(outs[1], (gathered @ bs[1]) * scales, dtype, f"A@B1 dim {dim}")
            # matmul + reduce-scatter: A's size along `dim` a multiple of the world size.
            shape = (2 * world, 3, 16) if dim == 0 else (2, 3 * world, 16)
            a_of = [_operand(r, 4, shape) for r in range(world)]
            b_of = [_operand(r, 5, (16, 6)) for r in range(world)]
            got = ct.fused_matmul_reduce_scatter(a_of[rank].to(dtype), b_of[rank].to(dtype),
                                                 "avg", dim)
            total = sum(a @ b for a, b in zip(a_of, b_of)) / world
            check(got, total.chunk(world, dim)[rank], dtype, f"reduce-scatter dim {dim}")
            checked += 4
    # Tensor parallel MLP: column-parallel up (gather the token shards), row-parallel down
    # (reduce-scatter back to token shards), against the dense layer pair.
    torch.manual_seed(0)
    up, down = torch.nn.Linear(16, 8 * world, bias=False), torch.nn.Linear(8 * world, 16, bias=False)
    x = torch.randn(4 * world, 16)
    w_up = up.weight.detach().chunk(world, 0)[rank]      # (8, 16): this rank's columns of up
    w_down = down.weight.detach().chunk(world, 1)[rank]  # (16, 8): this rank's rows of down
    _, (h,) = ct.fused_all_gather_matmul(x.chunk(world, 0)[rank], [w_up.t()], 0, return_A=False)
    y = ct.fused_matmul_reduce_scatter(torch.relu(h), w_down.t(), "sum", 0)
    with torch.no_grad():
        dense = down(torch.relu(up(x)))
    torch.testing.assert_close(y, dense.chunk(world, 0)[rank], rtol=1e-5, atol=1e-5)
    try:
        ct.fused_matmul_reduce_scatter(torch.ones(world + 1, 4), torch.ones(4, 2), "sum", 0)
        refused = ""
    except ValueError as e:
        refused = str(e)
    write(out_dir, {"checked": checked + 1, "refused": refused})


def chunked_entries(out_dir: str) -> None:
    """Collectives of tensors larger than the 1 MiB staging buffer, staged in several chunks,
    and one that fits: their results, and this rank's flight-recorder entries of them (one per
    torch call, the whole collective's sizes)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n = LARGE
    everyone = torch.stack([inputs(r, n) for r in range(world)])
    before = len(_entries(rank))
    t = inputs(rank, n).float()
    dist.all_reduce(t)
    check(t, everyone.sum(0), torch.float32, "chunked all_reduce")
    out = torch.empty(world * n)
    dist.all_gather_into_tensor(out, inputs(rank, n).float())
    check(out, everyone.reshape(-1), torch.float32, "chunked all_gather_into_tensor")
    big = torch.stack([inputs(rank * world + c, n) for c in range(world)])
    small = torch.empty(n)
    dist.reduce_scatter_tensor(small, big.reshape(-1).float())
    want = torch.stack([inputs(r * world + rank, n) for r in range(world)]).sum(0)
    check(small, want, torch.float32, "chunked reduce_scatter_tensor")
    t = inputs(rank, n).to(torch.bfloat16)
    dist.broadcast(t, src=world - 1)
    check(t, inputs(world - 1, n), torch.bfloat16, "chunked broadcast")
    recv = torch.empty(world * n)
    dist.all_to_all_single(recv, big.reshape(-1).float())
    want = torch.stack([inputs(p * world + rank, n) for p in range(world)])
    check(recv, want.reshape(-1), torch.float32, "chunked all_to_all_single")
    t = FACTORS(inputs(rank, n)).float()
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    check(t, FACTORS(everyone).prod(0), torch.float32, "chunked PRODUCT all_reduce")
    t = torch.ones(1001)
    dist.all_reduce(t)  # one chunk: the call's own entry, as before
    check(t, torch.full((1001,), float(world), dtype=torch.float64), torch.float32, "one chunk")
    entries = [[e["profiling_name"], e["input_sizes"], e["output_sizes"], e["input_dtypes"],
                e["state"], e["collective_seq_id"]] for e in _entries(rank)[before:]]
    write(out_dir, {"entries": entries, "n": n})


SCENARIOS = {f.__name__: f for f in (ops_matrix, coalesced, ddp, fsdp, hang, nan, death,
                                     bad_arguments, fused_matmul, zero_copy, work, interrupt,
                                     chunked_entries, rooted_and_objects, point_to_point)}


def main() -> None:
    scenario, out_dir, *args = sys.argv[1:]
    options = None
    if scenario == "hang":
        options = ct.Options(watchdog_policy="notify")
    elif scenario == "nan":
        options = ct.Options(nan_check="on", nan_policy="fail")
    timeout = float(os.environ.get("COMMD_TEST_PG_TIMEOUT", "60"))
    dist.init_process_group("commd", pg_options=options,
                            timeout=__import__("datetime").timedelta(seconds=timeout))
    SCENARIOS[scenario](out_dir, *args)
    if scenario not in ("hang", "death", "nan", "zero_copy", "interrupt"):
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
