"""commd as a torch.distributed backend.

Importing this module registers the backend ``"commd"`` for CPU tensors:

    import commd.torch  # noqa: F401  (registers "commd")
    torch.distributed.init_process_group("commd")         # under torchrun
    torch.distributed.init_process_group("cpu:commd,cuda:nccl")

Every process group is a commd group of the same name in one commd job, so the node's
daemon sees a torch job as it sees a C++ one: one flight-recorder entry per collective,
hang and dead-rank diagnosis, NaN checks, abort, metrics. A process group whose ranks are on
several commd nodes (daemons of one cluster) is a commd group spanning them, each node's
ranks its node-local part (see _placement), on CPU and CUDA tensors. Tensors are staged through the
group's symmetric buffer in chunks of ``Options.chunk_bytes``; tensors allocated with
:func:`empty` live in a symmetric buffer and skip the staging copies. docs/python.md has
the options, the supported operations and what each error means.

Collectives on host memory run synchronously: an ``async_op=True`` call returns a Work that
is already complete, and a failure raises from the call itself (``DistBackendError`` with the
``commd.Error`` chained as its cause).

When the package was built with torch (commd._c10d), the backend torch calls is a C++ one:
collectives on zero-copy tensors (all_reduce, broadcast, all_gather_into_tensor,
reduce_scatter_tensor) call the SDK there without Python; every other call goes to
:class:`ProcessGroupCommd`, as without it. ``COMMD_TORCH_CPP=0`` uses the Python backend
alone; ``COMMD_TORCH_CPP=1`` requires the C++ one.

The package, each module importing only those before it (python/tests/torch/test_layout.py
checks it):
_tensors (dtypes, reduce ops, a tensor as commd's calls see it), _work (the Work a call
returns), _session (options, the session, the node, a group's placement), _staging (the
staging buffers and the one driver every collective runs by), _collectives (torch's entry
points), _backend (ProcessGroupCommd), _adapters (the backend torch's hook makes, backend_of,
empty), _fused (the fused matmuls); this module registers the backend.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from ._adapters import _create, backend_of, empty  # noqa: F401
from ._backend import ProcessGroupCommd
from ._fused import fused_all_gather_matmul, fused_matmul_reduce_scatter  # noqa: F401
from ._session import BACKEND_NAME, Options

__all__ = ["Options", "ProcessGroupCommd", "empty", "backend_of"]


def _records_itself() -> None:
    """Lists commd among the backends that record their own collectives, so that torch
    (2.15 on) does not attach its generic FlightRecorderHook to commd's process groups: commd
    already records every collective in its own flight recorder (the daemon's, which
    `commctl dump` and `commctl fr export --format torch` read), and torch's hook would
    record each one a second time, in the process, with a Python traceback per call, ~1.5 us
    of a zero-copy call's ~5 (docs/PERFORMANCE.md, "The C++ backend's cost per call").
    COMMD_TORCH_FR_HOOK=1 leaves torch's hook on (its own dumps, `_dump_fr_trace`); a
    torch without the set has no such hook."""
    choice = os.environ.get("COMMD_TORCH_FR_HOOK", "0")
    if choice not in ("0", "1"):
        raise ValueError(f"commd: COMMD_TORCH_FR_HOOK={choice!r}; allowed 0, 1")
    backends = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if choice == "0" and isinstance(backends, set):
        backends.add(BACKEND_NAME)


dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
_records_itself()
