"""commd: the client SDK of the commd node communication daemon, for Python.

    import commd, numpy as np
    client = commd.Client.connect()                      # $COMMD_RUNTIME_DIR or the default
    group = client.join_group("tp", rank, world_size)    # blocks until every rank joined
    buf = group.allocate_symmetric(1 << 20)              # every rank's memory, mapped here
    x = buf.view("float32", (1024,))                     # a typed view of this rank's part
    np.asarray(x)[:] = 1.0                               # zero-copy
    group.all_reduce(x, op="sum")                        # in place, GIL released

Errors are commd.Error subclasses by gRPC code (see commd.errors). Neither numpy nor torch
is needed to import this package; both read the buffers zero-copy (buffer protocol,
DLPack). docs/python.md has the whole API and the Ctrl-C behaviour.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

from . import errors
from ._commd import (
    MAX_GLOBAL_WORLD_SIZE,
    MAX_GROUP_DESCRIPTION_BYTES,
    MAX_NAN_SAMPLE_PERIOD,
    MAX_POINT_TO_POINT_CHANNELS,
    MIN_NAN_SAMPLE_PERIOD,
    Client,
    Group,
    NanFinding,
    PersistentBuffer,
    PointToPointRequest,
    Recorder,
    RecordId,
    Store,
    SymmetricBuffer,
    TensorView,
)
from .errors import *  # noqa: F401,F403  (the exception classes are commd's API)

__version__ = "0.1.0"


@contextlib.contextmanager
def _record(
    self: Group,
    op: str,
    inputs: Iterable[Any] = (),
    outputs: Iterable[Any] = (),
    *,
    peer: int = -1,
    timeout_ms: int = 0,
    cuda_stream: int | None = None,
) -> Iterator[RecordId]:
    """Records a collective that runs elsewhere (NCCL, gloo, torch) in this rank's flight
    recorder: begun and started on entry, completed on a normal exit, abandoned when the
    block raises (the exception propagates) or when marking it started or completed does.

        with group.record("all_reduce", [t], [t]):
            other_library.all_reduce(t)

    `cuda_stream` (a cudaStream_t as an int; 0 the legacy default stream) marks it started and
    completed in that stream's order (Recorder.started / completed), for work queued on it;
    None marks them now.
    """
    recorder = self.recorder
    rid = recorder.begin(op, inputs, outputs, peer, timeout_ms)
    try:
        recorder.started(rid, cuda_stream)
        yield rid
        recorder.completed(rid, cuda_stream)
    except BaseException:
        recorder.abandoned(rid)
        raise


Group.record = _record  # type: ignore[attr-defined]

__all__ = [
    "MAX_GLOBAL_WORLD_SIZE",
    "MAX_GROUP_DESCRIPTION_BYTES",
    "MAX_NAN_SAMPLE_PERIOD",
    "MAX_POINT_TO_POINT_CHANNELS",
    "MIN_NAN_SAMPLE_PERIOD",
    "Client",
    "Group",
    "NanFinding",
    "PersistentBuffer",
    "PointToPointRequest",
    "Recorder",
    "RecordId",
    "Store",
    "SymmetricBuffer",
    "TensorView",
    "errors",
] + errors.__all__
