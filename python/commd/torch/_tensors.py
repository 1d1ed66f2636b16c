"""commd.torch's tensors and dtypes: which torch dtypes and reduce ops commd takes, and a
tensor as commd's calls see it (one contiguous row, host memory). A leaf: it imports torch
and commd's binding, nothing of commd.torch."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from commd import _commd

# torch dtype -> commd's name for it: the types commd's collectives take, from the
# vocabulary's rows (commd/vocabulary.h), whose names are torch's.
_DTYPES = {getattr(torch, name): name for name in _commd.COLLECTIVE_TYPES}

_ITEMSIZE = {d: torch.empty((), dtype=d).element_size() for d in _DTYPES}

# torch's reduce op -> commd's name for it: the vocabulary's reduce ops (commd/vocabulary.h),
# whose names are torch's in lower case.
_REDUCE_OPS = tuple((getattr(dist.ReduceOp, name.upper()), name) for name in _commd.REDUCE_OPS)
_BITWISE = ("band", "bor", "bxor")


def _commd_dtype(t: torch.Tensor, op: str) -> str:
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in _DTYPES)
        raise TypeError(
            f"commd {op}: tensor dtype {t.dtype} is not supported; allowed {allowed}") from None


def _reduce_op_name(op: Any, what: str, dtype: torch.dtype) -> str:
    """commd's name of torch's reduce op on `dtype`: NotImplementedError for an op commd has
    not, TypeError for AVG of bool (as PyTorch's NCCL backend raises)."""
    for torch_op, name in _REDUCE_OPS:
        if op == torch_op:
            if name == "avg" and dtype == torch.bool:
                raise TypeError(f"commd {what}: ReduceOp.AVG is not defined on bool; allowed "
                                "SUM (or), MIN (and), MAX (or), PRODUCT (and), BAND, BOR, BXOR")
            if name in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
                raise TypeError(f"commd {what}: ReduceOp.{name.upper()} is not defined on "
                                f"{dtype}; allowed on integer and bool tensors")
            return name
    # torch hands a ReduceOp object whose repr names no op; its `op` (a RedOpType) does.
    name = getattr(getattr(op, "op", op), "name", op)
    allowed = ", ".join(n.upper() for _, n in _REDUCE_OPS)
    raise NotImplementedError(f"commd {what}: reduce op {name} is not supported; allowed {allowed}")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """`t` as one contiguous row: itself when contiguous, else a copy (see _write_back)."""
    return t.contiguous().view(-1)


def _host(t: torch.Tensor) -> Any:
    """A contiguous CPU tensor as host memory for commd's calls with `staging` (a numpy view
    of its bytes, bfloat16 as int16: the call names the dtype, so the format does not matter).
    The kernels read it and write results into it directly."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def _write_back(t: torch.Tensor, flat: torch.Tensor) -> None:
    """Copies a result computed in `flat` (from _flat, or a contiguous copy of `t` of another
    shape) back into a non-contiguous `t`."""
    if not t.is_contiguous():
        t.copy_(flat.view(t.shape))


def _tensors_in(args: Sequence[Any]):
    """The tensors among a backend call's arguments (lists of them included)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors_in(a)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
