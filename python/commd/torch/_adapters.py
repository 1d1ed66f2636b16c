"""commd.torch's adapters to torch: the backend torch's constructor hook makes (the C++ one,
commd._c10d, wrapping ProcessGroupCommd when built), and the public lookups on a process
group (backend_of, empty)."""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ._backend import ProcessGroupCommd
from ._session import Options, _group_desc_being_made
from ._tensors import _commd_dtype

try:  # the C++ half of the backend, built only against a torch (python/CMakeLists.txt)
    from commd import _c10d
    _c10d_missing: str | None = None
except ImportError as _e:
    _c10d = None
    _c10d_missing = str(_e)


def _use_cpp() -> bool:
    """Whether process groups get the C++ backend (COMMD_TORCH_CPP: unset or "auto" when
    built, "0" never, "1" always, failing without it)."""
    choice = os.environ.get("COMMD_TORCH_CPP", "auto")
    if choice not in ("auto", "0", "1"):
        raise ValueError(f"commd: COMMD_TORCH_CPP={choice!r}; allowed auto, 0, 1")
    if choice == "1" and _c10d is None:
        raise RuntimeError(f"commd: COMMD_TORCH_CPP=1 but commd._c10d is not built or does not "
                           f"load ({_c10d_missing}); build with -DCOMMD_TORCH_PYTHON=<python "
                           "with torch>")
    return choice != "0" and _c10d is not None


def _create(dist_opts: Any, options: Any) -> Any:
    """torch's constructor hook (extended API): one commd group per process group, named as
    torch names the group ("0" for the default one), so that the flight recorder's entries
    carry the name torch's own flight recorder would. The C++ backend wraps the Python one
    (see commd.torch's docstring) on groups within one node."""
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"commd: pg_options of type {type(options).__name__}; pass "
                        "commd.torch.Options")
    rank, size = dist_opts.group_rank, dist_opts.group_size
    ranks = list(dist_opts.global_ranks_in_group)
    global_rank = ranks[rank] if ranks else rank
    backend = ProcessGroupCommd(dist_opts.store, rank, size, dist_opts.timeout,
                                str(dist_opts.group_id), global_rank, options,
                                description=_group_desc_being_made())
    if not _use_cpp() or backend.nodes > 1:
        return backend
    # The C++ backend asks the Python one's registry which tensors are zero-copy.
    return _c10d.Backend(backend, backend._group._internal_handle(),
                         backend._registry._internal_handle())


def backend_of(group: dist.ProcessGroup | None = None) -> ProcessGroupCommd:
    """The commd backend of a process group (default: the default group)."""
    pg = group or dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    if _c10d is not None and isinstance(backend, _c10d.Backend):
        backend = backend.python
    if not isinstance(backend, ProcessGroupCommd):
        raise ValueError(f"process group {pg.group_name!r} has no commd backend for cpu")
    return backend


def empty(shape: Sequence[int] | int, *, dtype: torch.dtype = torch.float32,
          device: str | torch.device = "cpu",
          group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """A tensor allocated in a symmetric buffer of `group`'s commd group (the spirit of
    torch's symm_mem.empty): collectives on it skip the staging copies. Collective: every
    rank of the group calls it in the same order with the same shape and dtype. Its memory
    is not zeroed by torch (the daemon hands out zeroed memory)."""
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"commd.torch.empty: device {device}; allowed cpu, cuda")
    _commd_dtype(torch.empty((), dtype=dtype), "empty")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    backend = backend_of(group)
    if dev.type == "cuda":
        # On the group's CUDA commd group: a kDLCUDA view of this rank's symmetric buffer.
        with torch.cuda.device(dev):
            backend = backend._on_device("empty", [torch.empty(0, device=dev)])
    return backend.empty(shape, dtype)
