"""ProcessGroupCommd, commd's torch.distributed backend (see commd.torch): a commd group per
process group and device, its symmetric tensors, how a call's failure reads. Its collectives
are the _Collectives mixin, run by the _Stager mixin's one driver."""

from __future__ import annotations

import datetime
import functools
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from commd import Client, Error, Group, RecordId, SymmetricBuffer
from commd._commd import SymmetricRegistry

from ._collectives import _Collectives
from ._point_to_point import _PointToPoint
from ._session import BACKEND_NAME, Options, _connect, _node_of, _Placement, _placement
from ._staging import _OnCurrentStream, _Stager, _Staging
from ._tensors import _ITEMSIZE, _commd_dtype, _tensors_in
from ._work import _completed


class ProcessGroupCommd(_Collectives, _PointToPoint, _Stager, _C10dBackend):
    """A torch.distributed backend over one commd group (see the module's docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
                 group_name: str, global_rank: int, options: Options | None = None,
                 description: str = "", device: str = "host",
                 placement: _Placement | None = None):
        super().__init__(rank, size)
        opts = (options or Options()).resolved()
        client = self._client = _connect(store, rank, size)
        self._name = group_name
        self._device = device
        place = self._placement = placement or _placement(store, rank, size, _node_of(client))
        # A CUDA process group's commd group: its own, on this rank's GPU, joined at the
        # first collective on CUDA tensors (see _on_device).
        self._make_cuda = functools.partial(
            ProcessGroupCommd, store, rank, size, timeout, group_name, global_rank, options,
            description, placement=place)
        self._cuda: ProcessGroupCommd | None = None
        commd_name = group_name if device == "host" else f"{group_name}.cuda"
        if place.nodes > 1:
            # A group spanning nodes: this node's ranks are a node-local group of the commd
            # group, every rank named by its group rank (counts, shapes and roots of its
            # collectives are the whole group's: docs/cluster.md).
            where = dict(rank=place.local_rank, world_size=place.local_size, global_rank=rank,
                         global_world_size=size)
        else:
            where = dict(rank=rank, world_size=size, global_rank=global_rank)
        try:
            group = client.join_group(
                commd_name, **where,
                timeout=timeout.total_seconds(), watchdog_policy=opts.watchdog_policy,
                nan_check=opts.nan_check, nan_sample_period=opts.nan_sample_period,
                nan_policy=opts.nan_policy, description=description, device=device)
        except Error as e:
            # Which job and group: a second torchrun job under the same COMMD_JOB_ID meets
            # the first one's group here (AlreadyExistsError), for one.
            spans = (f" (spanning {place.nodes} nodes: local rank {place.local_rank} of "
                     f"{place.local_size} on {place.node})" if place.nodes > 1 else "")
            raise dist.DistBackendError(
                f"commd: rank {rank} of {size} could not join group {commd_name!r} of commd "
                f"job {client.job_id!r}{spans}: {e}") from e
        self._group = group if device == "host" else _OnCurrentStream(group)
        self._staging = _Staging(self._group, opts.chunk_bytes)
        # What the SDK records as each collective's timeout, so that an entry recorded here
        # for a chunked collective reads as the SDK's own (_one_entry).
        self._timeout_ms = int(timeout.total_seconds() * 1000)
        # The buffers of this group's zero-copy tensors (empty): the one place that decides
        # whether a tensor needs staging, for this backend and the C++ one that wraps it
        # (_create hands it the registry's handle).
        self._registry = SymmetricRegistry()
        # The entry being recorded for the torch call that runs now, when it takes several
        # commd calls (_entry): each of them is a part of it.
        self._outer: RecordId | None = None
        self._fused: dict[int, SymmetricBuffer] = {}  # the fused matmuls' buffers, by role
        # The Works of sends and receives posted inside a coalescing block (start_coalescing
        # to end_coalescing), else None.
        self._coalesced: list[dist.Work] | None = None

    def _on_device(self, op: str, tensors: Sequence[Any]) -> "ProcessGroupCommd":
        """The backend that runs `op` on these tensors: this one for CPU tensors, the CUDA
        one (made on first use, on torch's current device) for CUDA tensors; ValueError for
        tensors on more than one device."""
        devices = sorted({str(t.device) for t in _tensors_in(tensors)})
        if len(devices) > 1:
            raise ValueError(f"commd {op}: tensors on {' and '.join(devices)}; one collective "
                             "takes tensors of one device")
        if not devices or not devices[0].startswith("cuda") or self._device != "host":
            return self
        # On a group spanning nodes the CUDA group spans them too (the SDK's CUDA path: the
        # node-local kernels and NCCL between the nodes, docs/cluster.md).
        if self._cuda is None:
            self._cuda = self._make_cuda(device=f"cuda:{torch.cuda.current_device()}")
        return self._cuda

    # -- identity ---------------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    @property
    def supports_coalescing(self) -> bool:
        """False, as the C++ backend answers: torch's batch_isend_irecv then posts each op and
        _coalescing_manager hands all-reduces to allreduce_coalesced. Defined here because
        torch's trampoline for a Python backend reads this property back through itself
        (RecursionError) when the backend has none."""
        return False

    @property
    def client(self) -> Client:
        """The process's commd session (shared by its process groups)."""
        return self._client

    @property
    def commd_group(self) -> Group:
        """The commd group behind this process group."""
        return self._group

    @property
    def nodes(self) -> int:
        """How many commd nodes hold this process group's ranks (1: a node-local group)."""
        return self._placement.nodes

    def _fused_buffer(self, role: int, nbytes: int) -> SymmetricBuffer:
        """The fused matmuls' symmetric buffer `role` (0: A's shard, 1: the workspace), grown
        to `nbytes` when smaller. Collective like the calls that use it: every rank asks for
        the same sizes in the same order, so every rank grows it at the same call."""
        buf = self._fused.get(role)
        if buf is None or buf.size < nbytes:
            self._fused.pop(role, None)
            buf = self._fused[role] = self._group.allocate_symmetric(nbytes)
        return buf

    # -- symmetric tensors (zero copy) -------------------------------------------------

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A tensor in a new symmetric buffer of this group; every rank calls it, in the
        same order, with the same shape and dtype."""
        count = 1
        for s in shape:
            count *= int(s)
        itemsize = _ITEMSIZE[dtype]
        buf = self._group.allocate_symmetric(max(count * itemsize, 1))
        self._registry.add(buf)
        return torch.from_dlpack(buf)[:count * itemsize].view(dtype).view(tuple(shape))

    def _symmetric_at(self, address: int, nbytes: int) -> SymmetricBuffer | None:
        """The symmetric buffer of a tensor of empty() that starts at `address` and has room
        for `nbytes` from there, else None (the registry's answer, as for _in_place_view)."""
        return self._registry.find(address, nbytes)

    # -- running a collective ----------------------------------------------------------

    def _run(self, op: str, call: Callable[[], Any], result: Any) -> dist.Work:
        try:
            call()
        except Error as e:
            raise self._backend_error(op, e) from e
        return _completed(result)

    def _backend_error(self, op: str, e: Error) -> dist.DistBackendError:
        """What a failed collective raises (here and in the C++ backend): the commd error
        chained as the cause."""
        error = dist.DistBackendError(
            f"commd {op} on process group {self._name!r} (rank {self.rank()} of "
            f"{self.size()}): {e}")
        error.__cause__ = e
        return error

    def _check(self, op: str, tensors: Sequence[torch.Tensor]) -> str:
        """Checks that the tensors are CPU tensors of one supported dtype; returns it."""
        cdtype = _commd_dtype(tensors[0], op)
        expected = "cpu" if self._device == "host" else "cuda"
        for t in tensors:
            if t.device.type != expected:
                raise ValueError(
                    f"commd {op}: tensor on {t.device}; this backend takes CPU and CUDA "
                    "tensors (\"cpu:commd,cuda:nccl\" sends CUDA tensors to NCCL)")
            if t.dtype != tensors[0].dtype:
                raise TypeError(
                    f"commd {op}: tensors of different dtypes ({tensors[0].dtype} and "
                    f"{t.dtype}); one collective takes one dtype")
        return cdtype

    def _pairwise(self, single: Callable[..., dist.Work], op: str, outputs: list[torch.Tensor],
                  inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        """A coalesced call of tensor pairs as one call per pair, each a part of the call's
        one flight-recorder entry (`op` of every pair's input and output)."""
        if len(outputs) != len(inputs):
            raise ValueError(f"commd {op} coalesced: {len(outputs)} output tensors for "
                             f"{len(inputs)} inputs; one output per input")
        sizes = [[(t.numel(), _commd_dtype(t, op)) for t in ts] for ts in (inputs, outputs)]
        with self._entry(op, *sizes):
            for o, i in zip(outputs, inputs):
                single(o, i, opts)
        return _completed(outputs)


def _dispatching(name: str) -> Callable[..., dist.Work]:
    """ProcessGroupCommd's `name`, run by the backend of its tensors' device."""
    method = getattr(ProcessGroupCommd, name)

    @functools.wraps(method)
    def run(self: ProcessGroupCommd, *args: Any) -> dist.Work:
        return method(self._on_device(name, args), *args)
    return run


# torch's entry points that take tensors; barrier and what commd does not do stay as they are.
for _name in ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather",
              "all_gather_single", "_allgather_base", "all_gather_single_coalesced",
              "allgather_into_tensor_coalesced", "allgather_coalesced", "gather", "scatter",
              "reduce_scatter", "reduce_scatter_single", "_reduce_scatter_base",
              "reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced",
              "all_to_all_single", "alltoall_base", "alltoall"):
    setattr(ProcessGroupCommd, _name, _dispatching(_name))
del _name
