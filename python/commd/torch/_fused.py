"""commd.torch's fused matmuls (async tensor parallelism) over a commd process group, with the
argument conventions of torch's symmetric-memory ops (torch.ops.symm_mem.fused_all_gather_matmul
and fused_matmul_reduce_scatter). Imported into commd.torch; CPU tensors."""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist

from ._adapters import backend_of
from ._tensors import _DTYPES, _host

_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check(op: str, tensors: Sequence[torch.Tensor]) -> str:
    for t in tensors:
        if t.device.type != "cpu":
            raise NotImplementedError(f"commd {op}: tensors on {t.device}; the fused matmuls "
                                      "of commd.torch take CPU tensors (the SDK's CUDA path, "
                                      "Group::AllGatherMatmul on a CUDA group, is not wired "
                                      "into the binding yet)")
        if t.dtype not in _FUSED_DTYPES or t.dtype != tensors[0].dtype:
            raise TypeError(f"commd {op}: every tensor must be one of float32, float16, bfloat16 "
                            f"and of one dtype; got {[str(x.dtype) for x in tensors]}")
    return _DTYPES[tensors[0].dtype]


def _leading(op: str, t: torch.Tensor, dim: int, what: str) -> int:
    d = dim + t.dim() if dim < 0 else dim
    if not 0 <= d < t.dim() - 1:
        raise ValueError(f"commd {op}: {what} {dim} must be a leading dimension of A "
                         f"(allowed: {-t.dim()}..{t.dim() - 2}; A has shape {tuple(t.shape)})")
    return d


def _row_scales(op: str, scale: torch.Tensor | None, a: torch.Tensor, dim: int):
    """A's row-wise scales (shape A.shape[:-1], or with a trailing 1) moved and flattened with
    A's rows, as float32 host memory: the scale of row i stays with row i after the reshape."""
    if scale is None:
        return None
    lead = tuple(a.shape[:-1])
    s = scale.reshape(scale.shape[:-1]) if scale.dim() == a.dim() and scale.shape[-1] == 1 else scale
    if tuple(s.shape) != lead:
        raise ValueError(f"commd {op}: A_scale has shape {tuple(scale.shape)}; row-wise scales "
                         f"take A's leading shape {lead} (or {lead + (1,)})")
    return _host(s.movedim(dim, 0).to(torch.float32).contiguous().reshape(-1))


def _col_scale(op: str, scale: torch.Tensor | None, n: int):
    if scale is None:
        return None
    if scale.numel() != n:
        raise ValueError(f"commd {op}: B_scale has {scale.numel()} elements; column-wise scales "
                         f"take B's {n} columns")
    return _host(scale.to(torch.float32).contiguous().reshape(-1))


def _backend_on_one_node(op: str, group: dist.ProcessGroup | None):
    """The group's commd backend; NotImplementedError for a group spanning nodes (the SDK's
    fused matmuls run over one node's symmetric memory), before anything is allocated."""
    backend = backend_of(group)
    if backend.nodes > 1:
        raise NotImplementedError(
            f"commd {op}: process group {backend._name!r} spans {backend.nodes} nodes; the "
            "fused matmuls run within one node (use a node-local new_group, or the unfused "
            "collective and matmul)")
    return backend


def _shard_buffer(backend, a: torch.Tensor, rows: int, scaled: bool):
    """The symmetric buffer the shard is multiplied from: the one `a` already starts (a tensor
    of commd.torch.empty, moved to dim 0 without a copy), when it has room for the row scales
    after the shard; else the backend's own, with `a` copied in."""
    nbytes = a.numel() * a.element_size()
    need = (nbytes + 63) // 64 * 64 + rows * 4 if scaled else nbytes
    buf = backend._symmetric_at(a.data_ptr(), need)
    if buf is not None:
        return buf
    shard = backend._fused_buffer(0, need)
    torch.from_dlpack(shard)[:nbytes].copy_(a.reshape(-1).view(torch.uint8))
    return shard


def fused_all_gather_matmul(A_shard: torch.Tensor, Bs: Sequence[torch.Tensor],  # noqa: N803
                            gather_dim: int = 0, group: dist.ProcessGroup | None = None, *,
                            return_A: bool = True,  # noqa: N803
                            A_scale: torch.Tensor | None = None,  # noqa: N803
                            B_scales: Sequence[torch.Tensor | None] | None = None,  # noqa: N803
                            ) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """(all_gather(A_shard, gather_dim) if return_A else None, [all_gather(A_shard) @ B for B
    in Bs]), with no gathered copy of A unless return_A: each rank multiplies every shard
    where it lies in the commd group's symmetric memory, its own first. A_shard (..., k) is
    used in place when it is a tensor of commd.torch.empty (and gather_dim is its first
    dimension), else copied once into a symmetric buffer of the group; each B is (k, n). Scaled form:
    A_scale row-wise (A_shard's leading shape), B_scales[i] column-wise (n) or None:
    out = (A @ B) * A_scale * B_scale. Collective: every rank calls it with the same shapes."""
    op = "fused_all_gather_matmul"
    dtype = _check(op, [A_shard, *Bs])
    d = _leading(op, A_shard, gather_dim, "gather_dim")
    backend = _backend_on_one_node(op, group)
    world = backend.commd_group.world_size
    a = A_shard.detach().movedim(d, 0).contiguous()
    rows, k = math.prod(a.shape[:-1]), a.shape[-1]
    for i, b in enumerate(Bs):
        if b.dim() != 2 or b.shape[0] != k:
            raise ValueError(f"commd {op}: Bs[{i}] has shape {tuple(b.shape)}; ({k}, n) needed")
    if B_scales is not None and len(B_scales) != len(Bs):
        raise ValueError(f"commd {op}: {len(B_scales)} B_scales for {len(Bs)} Bs")
    shard = _shard_buffer(backend, a, rows, A_scale is not None)
    outs = [torch.empty((world * rows, b.shape[1]), dtype=a.dtype) for b in Bs]
    gathered = torch.empty((world * rows, k), dtype=a.dtype) if return_A else None
    backend.commd_group.all_gather_matmul(
        shard, rows, k, [_host(b.detach().contiguous()) for b in Bs], [_host(o) for o in outs],
        dtype, row_scale=_row_scales(op, A_scale, A_shard, d),
        col_scales=None if B_scales is None else
        [_col_scale(op, s, b.shape[1]) for s, b in zip(B_scales, Bs)],
        gathered=None if gathered is None else _host(gathered))
    shape = (world * a.shape[0], *a.shape[1:-1])
    results = [o.view(*shape, o.shape[1]).movedim(0, d) for o in outs]
    a_all = None if gathered is None else gathered.view(*shape, k).movedim(0, d)
    return a_all, results


def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str = "sum",  # noqa: N803
                                scatter_dim: int = 0, group: dist.ProcessGroup | None = None, *,
                                A_scale: torch.Tensor | None = None,  # noqa: N803
                                B_scale: torch.Tensor | None = None,  # noqa: N803
                                ) -> torch.Tensor:
    """reduce_scatter(A @ B, reduce_op, scatter_dim) as one call: each rank's sgemm writes its
    partial product of each destination's rows straight into that rank's part of a symmetric
    workspace, and each rank reduces what it received. A (..., k), B (k, n); A's size along
    scatter_dim a multiple of the world size; reduce_op "sum" or "avg". Scaled form as
    fused_all_gather_matmul. Collective."""
    op = "fused_matmul_reduce_scatter"
    dtype = _check(op, [A, B])
    d = _leading(op, A, scatter_dim, "scatter_dim")
    if reduce_op not in ("sum", "avg"):
        raise ValueError(f"commd {op}: reduce_op {reduce_op!r}; allowed 'sum', 'avg'")
    backend = _backend_on_one_node(op, group)
    world = backend.commd_group.world_size
    a = A.detach().movedim(d, 0).contiguous()
    if a.shape[0] % world != 0:
        raise ValueError(f"commd {op}: A's size {a.shape[0]} along scatter_dim {scatter_dim} is "
                         f"not a multiple of the world size {world}")
    rows, k = math.prod(a.shape[:-1]), a.shape[-1]
    if B.dim() != 2 or B.shape[0] != k:
        raise ValueError(f"commd {op}: B has shape {tuple(B.shape)}; ({k}, n) needed")
    n = B.shape[1]
    out = torch.empty((rows // world, n), dtype=a.dtype)
    workspace = backend._fused_buffer(1, rows * n * 4)
    backend.commd_group.matmul_reduce_scatter(
        _host(a.reshape(rows, k)), rows, k, _host(B.detach().contiguous()), _host(out),
        workspace, reduce_op, dtype, row_scale=_row_scales(op, A_scale, A, d),
        col_scale=_col_scale(op, B_scale, n))
    return out.view(a.shape[0] // world, *a.shape[1:-1], n).movedim(0, d)
