"""One rank of a torch.distributed job on backend commd whose ranks are on two commd nodes
(two daemons of one etcd cluster), started by test_span.py as one torchrun per node:
`span_worker.py SCENARIO OUT_DIR [ARGS...]`, a scenario of this file or worker.py's ddp and
death. As worker.py, each rank checks its results itself (AssertionError: exit 1) and writes
what the test reads back to OUT_DIR/rank<N>.json."""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

import commd.torch as ct
from worker import DTYPES, check, ddp, death, inputs, reductions, write

# A staging buffer large enough for one all-reduce to run in lanes across the nodes (the SDK
# runs all-reduces of 4 MiB and more that way; smaller ones through the nodes' leaders).
LANE_CHUNK = 8 << 20


def run_ops(group, members: list[int], sizes, dtypes) -> int:
    """Every collective of the backend on `group` (None: the default group) whose ranks are
    `members` (world ranks in group-rank order), against float64 references built from
    every group rank's inputs. Returns the number of checks."""
    me, world = members.index(dist.get_rank()), len(members)
    checked = 0
    for n in sizes:
        for i, dtype in enumerate(dtypes):
            everyone = torch.stack([inputs(r, n, dtype) for r in range(world)])
            what = f"group {members} n={n} {dtype}"
            for name, op, x, want in reductions(dtype, everyone):
                t = x[me].to(dtype, copy=True)  # reduced in place: never x itself
                dist.all_reduce(t, op=op, group=group)
                check(t, want, dtype, f"all_reduce {name} {what}")
                checked += 1
            t = inputs(me, n, dtype).to(dtype)
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, t, group=group)
            check(torch.stack(outs), everyone, dtype, f"all_gather {what}")
            out = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(out, t, group=group)
            check(out, everyone.reshape(-1), dtype, f"all_gather_into_tensor {what}")
            # Block c of group rank r's input is inputs(r * world + c).
            blocks = torch.stack([
                torch.stack([inputs(r * world + c, n, dtype) for c in range(world)])
                for r in range(world)])
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, blocks[me].reshape(-1).to(dtype), group=group)
            check(out, blocks.sum(0)[me], dtype, f"reduce_scatter_tensor {what}")
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, [b.to(dtype) for b in blocks[me]], op=dist.ReduceOp.MAX,
                                group=group)
            check(out, blocks.max(0).values[me], dtype, f"reduce_scatter max {what}")
            root = (i + 1) % world  # roots on either node
            t = inputs(me, n, dtype).to(dtype) if me == root else torch.zeros(n, dtype=dtype)
            dist.broadcast(t, group_src=root, group=group)
            check(t, inputs(root, n, dtype), dtype, f"broadcast from group rank {root} {what}")
            recv = torch.empty(world * n, dtype=dtype)
            dist.all_to_all_single(recv, blocks[me].reshape(-1).to(dtype), group=group)
            check(recv, blocks[:, me].reshape(-1), dtype, f"all_to_all_single {what}")
            a, b = inputs(me, 3, dtype).to(dtype), inputs(me + 1, n, dtype).to(dtype)
            with dist._coalescing_manager(group=group):
                dist.all_reduce(a, group=group)
                dist.all_reduce(b, group=group)
            for got, shift, m in ((a, 0, 3), (b, 1, n)):
                want = torch.stack([inputs(r + shift, m, dtype) for r in range(world)]).sum(0)
                check(got, want, dtype, f"coalesced all_reduce {what}")
            checked += 8
    dist.barrier(group=group)
    return checked + 1


def non_contiguous(group, members: list[int]) -> int:
    """Transposed and strided tensors: staged through a contiguous copy and written back."""
    me, world = members.index(dist.get_rank()), len(members)
    everyone = torch.stack([inputs(r, 42) for r in range(world)])
    t = inputs(me, 42).reshape(6, 7).to(torch.bfloat16).t()
    dist.all_reduce(t, group=group)
    check(t, everyone.sum(0).reshape(6, 7).t(), torch.bfloat16, "all_reduce transposed")
    t = (inputs(me, 42) if me == world - 1 else torch.zeros(42)).float().reshape(6, 7).t()
    dist.broadcast(t, group_src=world - 1, group=group)
    check(t, everyone[world - 1].reshape(6, 7).t(), torch.float32, "broadcast transposed")
    m = torch.zeros(42, world)
    dist.all_gather([m[:, r] for r in range(world)], inputs(me, 84)[::2].float(), group=group)
    check(m.t(), torch.stack([inputs(r, 84)[::2] for r in range(world)]), torch.float32,
          "all_gather into columns")
    blocks = torch.stack([torch.stack([inputs(r * world + c, 5) for c in range(world)])
                          for r in range(world)])
    src = torch.zeros(world * 5, 2)
    src[:, 0] = blocks[me].reshape(-1)
    out = torch.zeros(5, 2)
    dist.reduce_scatter_tensor(out[:, 1], src[:, 0], group=group)
    check(out[:, 1], blocks.sum(0)[me], torch.float32, "reduce_scatter_tensor, strided")
    assert out[:, 0].eq(0).all(), out
    return 4


def zero_copy(group, members: list[int]) -> int:
    """commd.torch.empty tensors (symmetric buffers of the group): no staging copies; counts
    per global rank across the nodes; the 5 MiB all-reduce runs in lanes on nodes of two or
    more ranks each (the default group), through the leaders otherwise."""
    me, world = members.index(dist.get_rank()), len(members)
    n = 1001
    everyone = torch.stack([inputs(r, n) for r in range(world)])
    big_n = (5 << 20) // 4 + 3  # 5 MiB of float32: the SDK's lanes on nodes of equal size
    s = ct.empty((big_n,), group=group)
    s.copy_(inputs(me, big_n))
    dist.all_reduce(s, group=group)
    check(s, torch.stack([inputs(r, big_n) for r in range(world)]).sum(0), torch.float32,
          "zero-copy all_reduce of 5 MiB")
    inp, out = ct.empty((n,), group=group), ct.empty((world * n,), group=group)
    inp.copy_(inputs(me, n))
    dist.all_gather_into_tensor(out, inp, group=group)
    check(out, everyone.reshape(-1), torch.float32, "zero-copy all_gather_into_tensor")
    blocks = torch.stack([torch.stack([inputs(r * world + c, n) for c in range(world)])
                          for r in range(world)])
    wide, narrow = ct.empty((world * n,), group=group), ct.empty((n,), group=group)
    wide.copy_(blocks[me].reshape(-1))
    dist.reduce_scatter_tensor(narrow, wide, group=group)
    check(narrow, blocks.sum(0)[me], torch.float32, "zero-copy reduce_scatter_tensor")
    recv = ct.empty((world * n,), group=group)
    dist.all_to_all_single(recv, wide, group=group)
    check(recv, blocks[:, me].reshape(-1), torch.float32, "zero-copy all_to_all_single")
    b = ct.empty((n,), dtype=torch.int64, group=group)
    b.copy_(inputs(me, n) if me == world - 1 else torch.zeros(n))
    dist.broadcast(b, group_src=world - 1, group=group)
    check(b, inputs(world - 1, n), torch.int64, "zero-copy broadcast")
    return 5


def refusals() -> dict[str, str]:
    """What a group spanning nodes refuses, each raised on every rank before anything runs
    (so the group stays usable): NotImplementedError naming the operation and why; and what
    a CUDA tensor meets instead of a refusal."""
    seen = {}
    backend = ct.backend_of()
    with FakeTensorMode():  # a CUDA tensor's metadata, without a GPU
        on_gpu = torch.empty(4, device="cuda")
    opts = dist.AllreduceOptions()
    for name, fn in (
        ("recv from any source", lambda: dist.recv(torch.ones(1))),
        ("fused matmul", lambda: ct.fused_matmul_reduce_scatter(
            torch.ones(8, 4), torch.ones(4, 2), "sum", 0)),
    ):
        try:
            fn()
        except NotImplementedError as e:
            seen[name] = str(e)
        else:
            raise AssertionError(f"{name}: no NotImplementedError")
    # CUDA tensors go to the SDK's CUDA path across nodes: here (no GPU) they get as far as
    # asking torch for the current CUDA device, which fails as torch fails without one.
    try:
        backend.allreduce([on_gpu], opts)
    except Exception as e:  # noqa: BLE001 (which one is torch's, and is the point)
        seen["cuda"] = f"{type(e).__name__}: {e}"
    else:
        seen["cuda"] = "ran"
    return seen


def spanning(out_dir: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = ct.backend_of()
    g = backend.commd_group
    result = {"default": {"nodes": backend.nodes, "local": [g.rank, g.world_size],
                          "global": [g.global_rank, g.global_world_size],
                          "layout": [[n, list(r)] for n, r in g.layout]}}
    checked = run_ops(None, list(range(world)), (1, 1001), DTYPES)
    checked += run_ops(None, list(range(world)), (70001,), (torch.float32, torch.bfloat16))
    t = inputs(rank, (3 << 20) // 4 + 5).float()  # 3 MiB: several staging chunks
    dist.all_reduce(t)
    check(t, torch.stack([inputs(r, t.numel()) for r in range(world)]).sum(0), torch.float32,
          "all_reduce of 3 MiB in chunks")
    checked += 1 + non_contiguous(None, list(range(world))) + zero_copy(None, list(range(world)))
    # A ring of isends posted before their irecvs, two of its links between the nodes (each
    # such channel a group spanning the two nodes, one rank on each); 3 MiB in pieces too.
    for n in (1001, (3 << 18) + 5):
        out, got = inputs(rank, n).float(), torch.empty(n)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, (rank + 1) % world),
                                         dist.P2POp(dist.irecv, got, (rank - 1) % world)]):
            w.wait()
        assert torch.equal(got, inputs((rank - 1) % world, n).float()), n
        checked += 1
    result["refused"] = refusals()
    t = torch.ones(4)
    dist.all_reduce(t)  # still usable after the refusals
    assert t.eq(world).all(), t
    # Subgroups (every rank creates each, in the same order): the whole world again with a
    # staging buffer that takes a 5 MiB all-reduce in one call (lanes through the host-memory
    # path); ranks 1-3, one on the first node and two on the second; one rank of each node;
    # the second node's two ranks, a group on one node.
    everyone = dist.new_group(list(range(world)), pg_options=ct.Options(chunk_bytes=LANE_CHUNK))
    uneven = dist.new_group([1, 2, 3])
    one_each = dist.new_group([0, 2])
    local = dist.new_group([2, 3])
    big = inputs(rank, (5 << 20) // 4 + 7).float()
    dist.all_reduce(big, group=everyone)
    check(big, torch.stack([inputs(r, big.numel()) for r in range(world)]).sum(0),
          torch.float32, "all_reduce of 5 MiB staged in one call")
    checked += 1
    for name, group, members in (("uneven", uneven, [1, 2, 3]), ("one_each", one_each, [0, 2]),
                                 ("local", local, [2, 3])):
        if rank not in members:
            continue
        b = ct.backend_of(group)
        cg = b.commd_group
        result[name] = {"nodes": b.nodes, "local": [cg.rank, cg.world_size],
                        "global": [cg.global_rank, cg.global_world_size],
                        "layout": [[n, list(r)] for n, r in cg.layout]}
        checked += run_ops(group, members, (1, 1001), (torch.float32, torch.bfloat16,
                                                      torch.int64))
        checked += non_contiguous(group, members) + zero_copy(group, members)
    result["checked"] = checked
    dist.barrier()
    write(out_dir, result)


def no_cluster(out_dir: str) -> None:
    """Nothing to run: init_process_group is expected to fail (see main)."""
    write(out_dir, {"raised": None})


SCENARIOS = {f.__name__: f for f in (spanning, no_cluster, ddp, death)}


def main() -> None:
    scenario, out_dir, *args = sys.argv[1:]
    try:
        dist.init_process_group("commd", timeout=datetime.timedelta(seconds=60))
    except dist.DistBackendError as e:
        write(out_dir, {"raised": type(e).__name__, "message": str(e),
                        "cause": type(e.__cause__).__name__})
        return
    SCENARIOS[scenario](out_dir, *args)
    if scenario != "death":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
