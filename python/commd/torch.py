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
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import os
import secrets
import sys
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from . import MAX_GROUP_DESCRIPTION_BYTES, Client, Error, Group, RecordId, SymmetricBuffer

try:  # the C++ half of the backend, built only against a torch (python/CMakeLists.txt)
    from . import _c10d
    _c10d_missing: str | None = None
except ImportError as _e:
    _c10d = None
    _c10d_missing = str(_e)

__all__ = ["Options", "ProcessGroupCommd", "empty", "backend_of"]

BACKEND_NAME = "commd"

# torch dtype -> commd's name for it (the types commd's collectives reduce).
_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int32: "int32",
    torch.int64: "int64",
}

_ITEMSIZE = {d: torch.empty((), dtype=d).element_size() for d in _DTYPES}

_REDUCE_OPS = (
    (dist.ReduceOp.SUM, "sum"),
    (dist.ReduceOp.AVG, "avg"),
    (dist.ReduceOp.MIN, "min"),
    (dist.ReduceOp.MAX, "max"),
    (dist.ReduceOp.PRODUCT, "product"),  # all-gather, then the product here (commd has none)
)


@dataclasses.dataclass
class Options:
    """The backend's options: ``init_process_group("commd", pg_options=commd.torch.Options(...))``
    or ``dist.new_group(..., pg_options=...)``. Unset fields come from the environment
    (``COMMD_TORCH_CHUNK_BYTES``, ``COMMD_TORCH_WATCHDOG_POLICY``, ``COMMD_TORCH_NAN_CHECK``,
    ``COMMD_TORCH_NAN_POLICY``), then from the daemon's config."""

    # Bytes of each rank's staging buffer: a collective on a tensor that does not live in a
    # symmetric buffer is copied through it in pieces of at most this size (one
    # flight-recorder entry for all the pieces of a collective). 1 MiB to 1 GiB.
    chunk_bytes: int | None = None
    watchdog_policy: str | None = None  # "report" | "notify" | "terminate"
    nan_check: str | None = None  # "off" | "on" | "sampled"
    # For "sampled": commd.MIN_NAN_SAMPLE_PERIOD to MAX_NAN_SAMPLE_PERIOD; 0: the daemon's.
    nan_sample_period: int = 0
    nan_policy: str | None = None  # "report" | "fail"

    DEFAULT_CHUNK_BYTES = 16 << 20
    MIN_CHUNK_BYTES = 1 << 20
    MAX_CHUNK_BYTES = 1 << 30

    def resolved(self) -> "Options":
        env = os.environ.get
        chunk = self.chunk_bytes
        if chunk is None:
            chunk = int(env("COMMD_TORCH_CHUNK_BYTES", self.DEFAULT_CHUNK_BYTES))
        if not self.MIN_CHUNK_BYTES <= chunk <= self.MAX_CHUNK_BYTES:
            raise ValueError(
                f"commd.torch: chunk_bytes {chunk} is out of range; allowed "
                f"{self.MIN_CHUNK_BYTES} to {self.MAX_CHUNK_BYTES} (Options.chunk_bytes, "
                "COMMD_TORCH_CHUNK_BYTES)")
        return dataclasses.replace(
            self,
            chunk_bytes=chunk - chunk % 64,
            watchdog_policy=self.watchdog_policy or env("COMMD_TORCH_WATCHDOG_POLICY"),
            nan_check=self.nan_check or env("COMMD_TORCH_NAN_CHECK"),
            nan_policy=self.nan_policy or env("COMMD_TORCH_NAN_POLICY"),
        )


# One session per process: every process group of the job is a group of this session.
_client: Client | None = None


def _connect(store: dist.Store, group_rank: int, world_size: int) -> Client:
    """The process's session, opened by the first (default) process group. Without
    COMMD_JOB_ID the job id comes from rank 0 through torch's store, so two torchrun jobs on
    one node are two commd jobs. Every rank publishes the job it is in and checks its
    peers': a rank in another commd job (a COMMD_JOB_ID of its own) would otherwise wait in
    a rendezvous its peers never join until the group's timeout."""
    global _client
    if _client is None:
        job = os.environ.get("COMMD_JOB_ID")
        if group_rank == 0:
            store.set("commd/job_id", job or "torch-" + secrets.token_hex(6))
        if not job:
            job = store.get("commd/job_id").decode()
        store.set(f"commd/job_of_rank/{group_rank}", job)
        for r in range(world_size):
            theirs = store.get(f"commd/job_of_rank/{r}").decode()
            if theirs != job:
                raise RuntimeError(
                    f"commd: rank {group_rank} is in commd job {job!r} but rank {r} is in "
                    f"{theirs!r}; every rank of a torch job must be in one commd job (set the "
                    "same COMMD_JOB_ID on every rank, or none: the backend then makes one)")
        _client = Client.connect(job_id=job)
    return _client


# The commd node this process is attached to (see _node_of).
_node: str | None = None


def _node_of(client: Client) -> str:
    """The commd node this process's daemon is: its cluster node name (unique within a
    cluster), else the daemon itself (host, runtime dir, pid), so that ranks attached to two
    daemons without a cluster are two nodes and their group fails to join naming the missing
    cluster instead of running as two unrelated groups."""
    global _node
    if _node is None:
        status = client.status()
        cluster = status.get("cluster")
        if cluster and cluster.get("node_name"):
            _node = "node " + cluster["node_name"]
        else:
            _node = (f"daemon {status['hostname']}:{status['runtime_dir']} (pid "
                     f"{status['pid']}, no cluster)")
    return _node


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where a process group's ranks are: this rank's place among the group's ranks on its
    node (sorted by group rank) and how many nodes hold the group's ranks."""

    node: str
    local_rank: int
    local_size: int
    nodes: int


def _placement(store: dist.Store, rank: int, size: int, node: str) -> _Placement:
    """Every rank of the group publishes its node through the group's store and reads its
    peers': one round of the store per group, as torch's own backends exchange addresses."""
    store.set(f"commd/node_of_rank/{rank}", node)
    nodes = [v.decode() for v in
             store.multi_get([f"commd/node_of_rank/{r}" for r in range(size)])]
    mine = [r for r in range(size) if nodes[r] == node]
    return _Placement(node=node, local_rank=mine.index(rank), local_size=len(mine),
                      nodes=len(set(nodes)))


def _commd_dtype(t: torch.Tensor, op: str) -> str:
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in _DTYPES)
        raise TypeError(
            f"commd {op}: tensor dtype {t.dtype} is not supported; allowed {allowed}") from None


def _reduce_op_name(op: Any, what: str) -> str:
    for torch_op, name in _REDUCE_OPS:
        if op == torch_op:
            return name
    # torch hands a ReduceOp object whose repr names no op; its `op` (a RedOpType) does.
    name = getattr(getattr(op, "op", op), "name", op)
    raise NotImplementedError(
        f"commd {what}: reduce op {name} is not supported; allowed SUM, AVG, MIN, MAX, PRODUCT")


class _CompletedWork(dist.Work):
    """The Work of a collective that has finished when the call returns (host collectives run
    synchronously; a CUDA one is then queued on torch's stream). torch wraps what a Python
    backend returns in a holder that calls only wait() and get_future() of this object (the
    C++ backend answers the rest from the future, docs/torch.md "Work"); torch's own
    Work-from-a-future refuses wait() with a timeout. A failure raises from the call, so this
    Work never holds one."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._future: torch.futures.Future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return True

    def exception(self) -> None:
        return None


def _completed(result: Any) -> dist.Work:
    return _CompletedWork(result)


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
    """Copies a result computed in `flat` (from _flat) back into a non-contiguous `t`."""
    if not t.is_contiguous():
        t.copy_(flat.view(t.shape))


class _Staging:
    """Each rank's two staging buffers (symmetric allocations of chunk_bytes). The first is
    the `staging` of commd's host-memory calls: the kernels copy the tensor into it and write
    results straight into the tensor. The second holds what is not one contiguous piece of a
    tensor: a chunk of an all-gather's outputs, a chunk of a reduce-scatter's or all-to-all's
    blocks (those chunks run on the symmetric buffers, packed into the first, output in the
    second)."""

    def __init__(self, group: Group, nbytes: int):
        self.nbytes = nbytes
        self.buffers = (group.allocate_symmetric(nbytes), group.allocate_symmetric(nbytes))
        self.bytes = tuple(torch.from_dlpack(b) for b in self.buffers)  # uint8, this rank's

    def tensor(self, which: int, dtype: torch.dtype, count: int,
               offset_elems: int = 0) -> torch.Tensor:
        itemsize = _ITEMSIZE[dtype]
        start = offset_elems * itemsize
        return self.bytes[which][start:start + count * itemsize].view(dtype)

    def view(self, which: int, cdtype: str, count: int, offset_bytes: int = 0):
        return self.buffers[which].view(cdtype, (count,), offset_bytes)


# The Group methods that take a cuda_stream.
_STREAM_CALLS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                           "all_to_all", "all_reduce_coalesced"})


class _OnCurrentStream:
    """A commd group on a CUDA device whose collectives are queued on torch's current
    stream, so that they run after the staging copies torch queued there and before the
    copies back (the SDK's CUDA path returns once a collective is queued)."""

    def __init__(self, group: Group):
        self._group = group

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._group, name)
        if name not in _STREAM_CALLS:
            return attr

        def on_stream(*args: Any, **kwargs: Any) -> Any:
            return attr(*args, cuda_stream=torch.cuda.current_stream().cuda_stream, **kwargs)
        return on_stream


def _group_desc_being_made() -> str:
    """The description torch gives the process group it is creating (init_process_group's
    "default_pg", new_group's group_desc, else "undefined"). torch sets it on the group only
    after the group's backends exist and passes a backend's constructor no copy, so it is
    read from the torch function that is calling the constructor; a torch that calls it
    otherwise gives "undefined", as torch describes a group without one. Bounded to what the
    daemon takes: printable ASCII ('?' for any other character), at most
    MAX_GROUP_DESCRIPTION_BYTES."""
    desc = "undefined"
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name == "_new_process_group_helper"
                and frame.f_globals.get("__name__") == dist.distributed_c10d.__name__):
            found = frame.f_locals.get("group_desc")
            if isinstance(found, str) and found:
                desc = found
            break
        frame = frame.f_back
    return "".join(c if " " <= c <= "~" else "?" for c in desc)[:MAX_GROUP_DESCRIPTION_BYTES]


class ProcessGroupCommd(_C10dBackend):
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
        self._symmetric: list[tuple[int, int, SymmetricBuffer]] = []  # (start, end, buffer)
        # The entry being recorded for the torch call that runs now, when it takes several
        # commd calls (_entry): each of them is a part of it.
        self._outer: RecordId | None = None
        # The C++ backend's registry of those buffers when it wraps this one (_create).
        self._registry: Any = None
        self._fused: dict[int, SymmetricBuffer] = {}  # the fused matmuls' buffers, by role

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
        whole = torch.from_dlpack(buf)
        self._symmetric.append((whole.data_ptr(), whole.data_ptr() + buf.size, buf))
        if self._registry is not None:
            self._registry.add(buf._internal_handle())
        return whole[:count * itemsize].view(dtype).view(tuple(shape))

    def _in_place_view(self, t: torch.Tensor, cdtype: str):
        """The commd view of `t` when it starts one of this group's symmetric buffers and is
        contiguous (no staging needed), else None."""
        if not self._symmetric or not t.is_contiguous():
            return None
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        for lo, hi, buf in self._symmetric:
            if start == lo and end <= hi:  # commd's collectives take a buffer from its start
                return buf.view(cdtype, (t.numel(),))
        return None

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

    def _outside(self, call: str, src: torch.Tensor, dst: torch.Tensor, n: int, cdtype: str,
                 out_slots: int = 1, **kwargs: Any) -> None:
        """One commd call on contiguous tensors outside symmetric memory: `src` is the input
        (n elements, or world_size * n for reduce_scatter and all_to_all), `dst` the output
        (out_slots * n elements), the same tensor for all_reduce and broadcast. CPU: the SDK's
        host-memory call, whose kernels read `src` and write `dst` directly. CUDA: the SDK
        takes device memory only in symmetric buffers, so `src` is copied into the first
        staging buffer and the result out of it (in place) or of the second, all queued on
        torch's current stream."""
        method = getattr(self._group, call)
        kwargs.setdefault("part_of", self._outer)
        if self._device == "host":
            data = (_host(dst),) if src is dst else (_host(src), _host(dst))
            method(*data, count=n, dtype=cdtype, staging=self._staging.buffers[0], **kwargs)
            return
        src = src.reshape(-1)
        self._staging.tensor(0, src.dtype, src.numel()).copy_(src)
        if src is dst or src.data_ptr() == dst.data_ptr():
            method(self._staging.view(0, cdtype, n), **kwargs)
            dst.reshape(-1).copy_(self._staging.tensor(0, dst.dtype, n))
            return
        method(self._staging.view(0, cdtype, src.numel()),
               self._staging.view(1, cdtype, out_slots * n), **kwargs)
        dst.reshape(-1).copy_(self._staging.tensor(1, dst.dtype, out_slots * n))

    def _chunks(self, count: int, itemsize: int, slots: int) -> list[tuple[int, int]]:
        """(start, n) pieces of `count` elements such that `slots` pieces fit one staging
        buffer; none for an empty tensor (every rank has the same count, so all skip)."""
        per = max(self._staging.nbytes // (slots * itemsize), 1)
        return [(start, min(per, count - start)) for start in range(0, count, per)]

    @contextlib.contextmanager
    def _entry(self, op: str, inputs: Sequence[tuple[int, str]],
               outputs: Sequence[tuple[int, str]]):
        """One flight-recorder entry for a torch call that takes several commd calls: the
        entry one commd call of the whole would record (`op`, the (element count, dtype) of
        each input and output, this group's timeout), begun here and completed when the block
        ends (abandoned when it raises). Yields its RecordId, which every commd call of the
        block passes as `part_of` (`self._outer`). Inside another such block it begins
        nothing and yields the enclosing entry: a coalesced call's tensors that are staged in
        chunks are parts of the coalesced call's one entry. On a CUDA group the entry is
        marked started and completed on torch's current stream, the one the calls are queued
        on (_OnCurrentStream), so its progress follows the device as a single call's would."""
        if self._outer is not None:
            yield self._outer
            return
        stream = None if self._device == "host" else torch.cuda.current_stream().cuda_stream
        with self._group.record(op, [((n,), d) for n, d in inputs],
                                [((n,), d) for n, d in outputs],
                                timeout_ms=self._timeout_ms, cuda_stream=stream) as rid:
            self._outer = rid
            try:
                yield rid
            finally:
                self._outer = None

    @contextlib.contextmanager
    def _one_entry(self, pieces: Sequence[Any], op: str, cdtype: str, in_count: int,
                   out_count: int):
        """The entry of a collective staged in several `pieces` (`op` of `in_count` elements
        in, `out_count` out, of `cdtype`; see _entry); yields its RecordId for each piece's
        `part_of`. One piece (or none) yields the enclosing entry, if any: that call records
        its own entry otherwise, as a single call does."""
        if len(pieces) <= 1:
            yield self._outer
            return
        with self._entry(op, [(in_count, cdtype)], [(out_count, cdtype)]) as rid:
            yield rid

    # -- all-reduce ----------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        if len(tensors) != 1:
            raise ValueError(f"commd allreduce: {len(tensors)} tensors; one per call")
        t = tensors[0]
        cdtype = self._check("allreduce", tensors)
        op = _reduce_op_name(opts.reduceOp, "allreduce")
        return self._run("allreduce", lambda: self._all_reduce(t, cdtype, op), tensors)

    def _all_reduce(self, t: torch.Tensor, cdtype: str, op: str) -> None:
        if op == "product":
            self._product(t, cdtype)
            return
        view = self._in_place_view(t, cdtype)
        if view is not None:
            self._group.all_reduce(view, op=op, part_of=self._outer)
            return
        flat = _flat(t)
        pieces = self._chunks(flat.numel(), t.element_size(), 1)
        with self._one_entry(pieces, "all_reduce", cdtype, flat.numel(), flat.numel()) as whole:
            for start, n in pieces:
                piece = flat[start:start + n]
                self._outside("all_reduce", piece, piece, n, cdtype, op=op, part_of=whole)
        _write_back(t, flat)

    def _product(self, t: torch.Tensor, cdtype: str) -> None:
        """PRODUCT: commd reduces sum, avg, min and max; the product is taken here over an
        all-gather (each rank multiplies the world's values in rank order)."""
        world = self.size()
        flat = _flat(t)
        itemsize = t.element_size()
        pieces = self._chunks(flat.numel(), itemsize, world)
        count = flat.numel()
        with self._one_entry(pieces, "all_gather", cdtype, count, world * count) as whole:
            for start, n in pieces:
                self._staging.tensor(0, t.dtype, n).copy_(flat[start:start + n])
                self._group.all_gather(self._staging.view(0, cdtype, n),
                                       self._staging.view(1, cdtype, world * n), part_of=whole)
                gathered = self._staging.tensor(1, t.dtype, world * n).view(world, n)
                flat[start:start + n].copy_(torch.prod(gathered, dim=0).to(t.dtype))
        _write_back(t, flat)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        """One commd coalesced all-reduce for the tensors, when they fit the staging buffer
        together; else one all-reduce per tensor, each a part of the call's one
        flight-recorder entry."""
        cdtype = self._check("allreduce_coalesced", tensors)
        op = _reduce_op_name(opts.reduceOp, "allreduce_coalesced")
        return self._run("allreduce_coalesced",
                         lambda: self._all_reduce_coalesced(tensors, cdtype, op), tensors)

    def _all_reduce_coalesced(self, tensors: list[torch.Tensor], cdtype: str, op: str) -> None:
        itemsize = tensors[0].element_size()
        total = sum(t.numel() for t in tensors)
        if op == "product" or total * itemsize > self._staging.nbytes:
            counts = [(t.numel(), cdtype) for t in tensors]
            if op == "product":  # recorded as the all-gathers it runs (_product)
                entry = ("all_gather", counts, [(n * self.size(), d) for n, d in counts])
            else:
                entry = ("all_reduce", counts, counts)
            with self._entry(*entry):
                for t in tensors:
                    self._all_reduce(t, cdtype, op)
            return
        views, offset = [], 0
        for t in tensors:
            self._staging.tensor(0, t.dtype, t.numel(), offset).copy_(t.reshape(-1))
            views.append(self._staging.view(0, cdtype, t.numel(), offset * itemsize))
            offset += t.numel()
        self._group.all_reduce_coalesced(views, op=op)
        offset = 0
        for t in tensors:
            t.copy_(self._staging.tensor(0, t.dtype, t.numel(), offset).view(t.shape))
            offset += t.numel()

    # start/end_coalescing: torch's _coalescing_manager hands the captured all-reduces to
    # allreduce_coalesced itself; anything else inside the block runs as it is called, so
    # there is nothing to hold back here.
    def start_coalescing(self) -> None:
        pass

    def end_coalescing(self) -> dist.Work:
        return _completed(None)

    # -- broadcast -------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        if len(tensors) != 1:
            raise ValueError(f"commd broadcast: {len(tensors)} tensors; one per call")
        t = tensors[0]
        cdtype = self._check("broadcast", tensors)
        root = opts.rootRank
        return self._run("broadcast", lambda: self._broadcast(t, cdtype, root), tensors)

    def _broadcast(self, t: torch.Tensor, cdtype: str, root: int) -> None:
        view = self._in_place_view(t, cdtype)
        if view is not None:
            self._group.broadcast(view, root=root, part_of=self._outer)
            return
        flat = _flat(t)
        pieces = self._chunks(flat.numel(), t.element_size(), 1)
        with self._one_entry(pieces, "broadcast", cdtype, flat.numel(), flat.numel()) as whole:
            for start, n in pieces:
                piece = flat[start:start + n]
                self._outside("broadcast", piece, piece, n, cdtype, root=root, part_of=whole)
        if self.rank() != root:
            _write_back(t, flat)

    # -- all-gather ---------------------------------------------------------------------

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any) -> dist.Work:
        if len(inputs) != 1 or len(outputs) != 1:
            raise ValueError("commd allgather: one input tensor and one output list per call")
        out, t = outputs[0], inputs[0]
        if len(out) != self.size():
            raise ValueError(f"commd allgather: {len(out)} output tensors; the group has "
                             f"{self.size()} ranks")
        cdtype = self._check("allgather", [t] + list(out))
        for o in out:
            if o.numel() != t.numel():
                raise ValueError(f"commd allgather: output tensor of {o.numel()} elements; "
                                 f"the input has {t.numel()} (every tensor the same size)")
        return self._run("allgather", lambda: self._all_gather(list(out), t, cdtype), outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any) -> dist.Work:
        cdtype = self._check("all_gather_into_tensor", [input, output])
        if output.numel() != input.numel() * self.size():
            raise ValueError(
                f"commd all_gather_into_tensor: output has {output.numel()} elements; it "
                f"must have world_size ({self.size()}) x input ({input.numel()}) = "
                f"{input.numel() * self.size()}")
        return self._run("all_gather_into_tensor",
                         lambda: self._all_gather_single(output, input, cdtype), output)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        return self._pairwise(self.all_gather_single, "all_gather", outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _all_gather_single(self, output: torch.Tensor, t: torch.Tensor, cdtype: str) -> None:
        in_view = self._in_place_view(t, cdtype)
        out_view = self._in_place_view(output, cdtype)
        if in_view is not None and out_view is not None:
            self._group.all_gather(in_view, out_view, part_of=self._outer)
            return
        flat = _flat(output)
        n = t.numel()
        # What one call stages: the input on CPU, the gathered output on CUDA and on a group
        # spanning nodes (whose results come back through the staging buffer) too.
        node_local_host = self._device == "host" and self.nodes == 1
        staged = n * t.element_size() * (1 if node_local_host else self.size())
        if output.is_contiguous() and 0 < staged <= self._staging.nbytes:
            # One call: on CPU the kernels stage the input and gather straight into the output.
            self._outside("all_gather", _flat(t), flat, n, cdtype, out_slots=self.size())
            return
        self._all_gather([flat[r * n:(r + 1) * n] for r in range(self.size())], t, cdtype)
        _write_back(output, flat)

    def _all_gather(self, out: list[torch.Tensor], t: torch.Tensor, cdtype: str) -> None:
        world = self.size()
        src = _flat(t)
        targets = [_flat(o) for o in out]
        itemsize = t.element_size()
        pieces = self._chunks(src.numel(), itemsize, world)
        count = src.numel()
        with self._one_entry(pieces, "all_gather", cdtype, count, world * count) as whole:
            for start, n in pieces:
                staged = self._staging.tensor(1, t.dtype, world * n)
                self._outside("all_gather", src[start:start + n], staged, n, cdtype,
                              out_slots=world, part_of=whole)
                staged = staged.view(world, n)
                for r in range(world):
                    targets[r][start:start + n].copy_(staged[r])
        for o, flat in zip(out, targets):
            _write_back(o, flat)

    # -- reduce-scatter -------------------------------------------------------------------

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any) -> dist.Work:
        if len(inputs) != 1 or len(outputs) != 1:
            raise ValueError("commd reduce_scatter: one output tensor and one input list "
                             "per call")
        out, ins = outputs[0], inputs[0]
        if len(ins) != self.size():
            raise ValueError(f"commd reduce_scatter: {len(ins)} input tensors; the group has "
                             f"{self.size()} ranks")
        cdtype = self._check("reduce_scatter", [out] + list(ins))
        op = _reduce_op_name(opts.reduceOp, "reduce_scatter")
        for i in ins:
            if i.numel() != out.numel():
                raise ValueError(f"commd reduce_scatter: input tensor of {i.numel()} "
                                 f"elements; the output has {out.numel()} (every tensor the "
                                 "same size)")
        whole = torch.cat([i.reshape(-1) for i in ins])
        return self._run("reduce_scatter",
                         lambda: self._reduce_scatter(out, whole, cdtype, op), outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any) -> dist.Work:
        cdtype = self._check("reduce_scatter_tensor", [input, output])
        op = _reduce_op_name(opts.reduceOp, "reduce_scatter_tensor")
        if input.numel() != output.numel() * self.size():
            raise ValueError(
                f"commd reduce_scatter_tensor: input has {input.numel()} elements; it must "
                f"have world_size ({self.size()}) x output ({output.numel()}) = "
                f"{output.numel() * self.size()}")
        return self._run("reduce_scatter_tensor",
                         lambda: self._reduce_scatter(output, input, cdtype, op), output)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        return self._pairwise(self.reduce_scatter_single, "reduce_scatter", outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, cdtype: str,
                        op: str) -> None:
        if op == "product":
            whole = input.contiguous().clone()
            self._product(whole, cdtype)
            n = output.numel()
            output.copy_(whole.view(-1)[self.rank() * n:(self.rank() + 1) * n]
                         .view(output.shape))
            return
        in_view = self._in_place_view(input, cdtype)
        out_view = self._in_place_view(output, cdtype)
        if in_view is not None and out_view is not None:
            self._group.reduce_scatter(in_view, out_view, op=op, part_of=self._outer)
            return
        world = self.size()
        src = input.contiguous().view(world, -1)
        dst = output.contiguous().view(-1)
        count = dst.numel()
        itemsize = input.element_size()
        if 0 < world * count * itemsize <= self._staging.nbytes:
            # One call: the kernels stage the input and write this rank's chunk to the output.
            self._outside("reduce_scatter", src, dst, count, cdtype, op=op)
            _write_back(output, dst)
            return
        # A chunk takes a piece of every rank's block: packed into the first staging buffer.
        pieces = self._chunks(count, itemsize, world)
        with self._one_entry(pieces, "reduce_scatter", cdtype, world * count, count) as whole:
            for start, n in pieces:
                self._staging.tensor(0, input.dtype, world * n).view(world, n).copy_(
                    src[:, start:start + n])
                self._group.reduce_scatter(self._staging.view(0, cdtype, world * n),
                                           self._staging.view(1, cdtype, n), op=op,
                                           part_of=whole)
                dst[start:start + n].copy_(self._staging.tensor(1, input.dtype, n))
        _write_back(output, dst)

    # -- all-to-all ---------------------------------------------------------------------

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_splits: list[int], input_splits: list[int],
                          opts: Any) -> dist.Work:
        world = self.size()
        cdtype = self._check("all_to_all_single", [input, output])
        for name, splits, t in (("input", input_splits, input), ("output", output_splits,
                                                                  output)):
            if splits and any(s != splits[0] for s in splits):
                raise NotImplementedError(
                    f"commd all_to_all_single: uneven {name} splits {list(splits)}; commd "
                    "supports equal splits only")
        if input.numel() != output.numel() or input.numel() % world != 0:
            raise ValueError(
                f"commd all_to_all_single: input ({input.numel()} elements) and output "
                f"({output.numel()}) must be the same size, a multiple of world_size ({world})")
        return self._run("all_to_all_single",
                         lambda: self._all_to_all(output, input, cdtype), output)

    alltoall_base = all_to_all_single

    def _all_to_all(self, output: torch.Tensor, input: torch.Tensor, cdtype: str) -> None:
        in_view = self._in_place_view(input, cdtype)
        out_view = self._in_place_view(output, cdtype)
        if in_view is not None and out_view is not None:
            self._group.all_to_all(in_view, out_view, part_of=self._outer)
            return
        world = self.size()
        src = input.contiguous().view(world, -1)
        dst = output.contiguous().view(world, -1)
        count = src.shape[1]
        itemsize = input.element_size()
        if 0 < world * count * itemsize <= self._staging.nbytes:
            # One call: the kernels stage the input and write the blocks to the output.
            self._outside("all_to_all", src, dst, count, cdtype, out_slots=world)
            _write_back(output, dst)
            return
        # A chunk takes a piece of every block: packed into the first staging buffer.
        pieces = self._chunks(count, itemsize, world)
        with self._one_entry(pieces, "all_to_all", cdtype, world * count,
                             world * count) as whole:
            for start, n in pieces:
                self._staging.tensor(0, input.dtype, world * n).view(world, n).copy_(
                    src[:, start:start + n])
                self._group.all_to_all(self._staging.view(0, cdtype, world * n),
                                       self._staging.view(1, cdtype, world * n), part_of=whole)
                dst[:, start:start + n].copy_(
                    self._staging.tensor(1, input.dtype, world * n).view(world, n))
        _write_back(output, dst)

    # -- barrier ------------------------------------------------------------------------

    def barrier(self, opts: Any) -> dist.Work:
        return self._run("barrier", self._group.barrier, None)

    # -- what commd does not do ---------------------------------------------------------

    def _unsupported(name: str):  # noqa: N805 (builds methods below)
        def method(self, *args: Any, **kwargs: Any) -> dist.Work:
            raise NotImplementedError(
                f"commd does not support {name}; supported: all_reduce, "
                "all_reduce_coalesced, broadcast, all_gather, all_gather_into_tensor, "
                "reduce_scatter, reduce_scatter_tensor, all_to_all_single (equal splits), "
                "barrier")
        method.__name__ = name
        return method

    send = _unsupported("send")
    recv = _unsupported("recv")
    recv_anysource = _unsupported("recv_anysource")
    gather = _unsupported("gather")
    scatter = _unsupported("scatter")
    reduce = _unsupported("reduce")
    alltoall = _unsupported("all_to_all (list form; use all_to_all_single)")
    allgather_coalesced = _unsupported("allgather_coalesced")
    allreduce_sparse = _unsupported("allreduce_sparse")
    monitored_barrier = _unsupported("monitored_barrier")
    del _unsupported


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
    (see the module's docstring) on groups within one node."""
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
    backend._registry = _c10d.SymmetricRegistry()
    return _c10d.Backend(backend, backend._group._internal_handle(), backend._registry)


def _tensors_in(args: Sequence[Any]):
    """The tensors among a backend call's arguments (lists of them included)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors_in(a)


def _dispatching(name: str) -> Callable[..., dist.Work]:
    """ProcessGroupCommd's `name`, run by the backend of its tensors' device."""
    method = getattr(ProcessGroupCommd, name)

    @functools.wraps(method)
    def run(self: ProcessGroupCommd, *args: Any) -> dist.Work:
        return method(self._on_device(name, args), *args)
    return run


# torch's entry points that take tensors; barrier and what commd does not do stay as they are.
for _name in ("allreduce", "allreduce_coalesced", "broadcast", "allgather",
              "all_gather_single", "_allgather_base", "all_gather_single_coalesced",
              "allgather_into_tensor_coalesced", "reduce_scatter", "reduce_scatter_single",
              "_reduce_scatter_base", "reduce_scatter_single_coalesced",
              "reduce_scatter_tensor_coalesced", "all_to_all_single", "alltoall_base"):
    setattr(ProcessGroupCommd, _name, _dispatching(_name))
del _name


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

from commd._fused import fused_all_gather_matmul, fused_matmul_reduce_scatter  # noqa: E402,F401
