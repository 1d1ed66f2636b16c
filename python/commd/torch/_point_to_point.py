"""commd.torch's point-to-point: torch's send, recv (and so isend, irecv, batch_isend_irecv,
P2POp and the pipelining schedules) and monitored_barrier on CPU tensors, through the commd group's point-to-point
channels (commd.Group.isend / irecv: a channel per sender, receiver and tag, each moving its
messages in order on a thread of its own, so a ring of sends posted before their receives
completes). A mixin of ProcessGroupCommd: it reads the backend's `_group`, `_check`,
`_backend_error` and `_coalesced`."""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from commd import Error

from ._tensors import _host
from ._work import _AllWork, _PendingWork, _completed

# The tag of monitored_barrier's messages: the last one commd takes (commd/limits.h).
MONITORED_BARRIER_TAG = 0x7FFFFFFF


class _PointToPoint:
    """torch's send and recv on a commd group (see the module's docstring)."""

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> dist.Work:
        t = self._one("send", tensors)
        cdtype = self._check("send", [t])
        src = t.detach().contiguous()  # itself when contiguous; held until sent
        return self._post("send", lambda: self._group.isend(_host(src), dst_rank, tag,
                                                             dtype=cdtype), tensors, None)

    def recv(self, tensors: list[torch.Tensor], src_rank: int | None, tag: int) -> dist.Work:
        t = self._one("recv", tensors)
        cdtype = self._check("recv", [t])
        into = t.detach() if t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype)
        then = None if t.is_contiguous() else (lambda: t.detach().copy_(into))
        return self._post("recv", lambda: self._group.irecv(_host(into), src_rank, tag,
                                                             dtype=cdtype), tensors, then)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        """torch's own call on the Python backend alone (a process group spanning nodes, or
        COMMD_TORCH_CPP=0): torch then holds the Work in a wrapper that hides its sender."""
        raise NotImplementedError(
            "commd recv from any source: this process group runs on commd's Python backend "
            "alone (it spans nodes, or COMMD_TORCH_CPP=0), whose Work torch cannot ask for the "
            "sender; name the sender (dist.recv(t, src=...))")

    def _recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        """The first message any rank sends this one with `tag` (commd.Group.irecv with peer
        None, within one node); commd._c10d calls it, and answers torch's sourceRank() from
        the Work's _source_rank()."""
        return self.recv(tensors, None, tag)

    def monitored_barrier(self, opts: Any, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier, on the point-to-point channels: every other rank sends
        rank 0 a byte and waits for its answer; rank 0 waits up to opts.timeout for all of
        them and raises RuntimeError naming the first rank that did not come (every such
        rank with `wait_all_ranks`), as gloo does. Its messages use the last tag,
        MONITORED_BARRIER_TAG."""
        timeout = opts.timeout
        ms = int(timeout.total_seconds() * 1000)
        token = [torch.zeros(1, dtype=torch.uint8)]
        if self.rank() != 0:
            for work in (self.send(token, 0, MONITORED_BARRIER_TAG),
                         self.recv([torch.zeros(1, dtype=torch.uint8)], 0,
                                   MONITORED_BARRIER_TAG)):
                if not work.done_within(timeout.total_seconds()):
                    raise RuntimeError(f"Rank 0 failed to pass monitoredBarrier in {ms} ms")
                work.wait()
            return
        deadline = time.monotonic() + timeout.total_seconds()
        arrivals = [(r, self.recv([torch.zeros(1, dtype=torch.uint8)], r,
                                  MONITORED_BARRIER_TAG)) for r in range(1, self.size())]
        missing = []
        for r, work in arrivals:
            if not work.done_within(deadline - time.monotonic()):
                missing.append(r)
                if not wait_all_ranks:
                    break
            else:
                work.wait()
        if len(missing) == 1 or (missing and not wait_all_ranks):
            raise RuntimeError(f"Rank {missing[0]} failed to pass monitoredBarrier in {ms} ms")
        if missing:
            raise RuntimeError(f"Ranks {', '.join(map(str, missing))} failed to pass "
                               f"monitoredBarrier in {ms} ms")
        for work in [self.send(token, r, MONITORED_BARRIER_TAG) for r in range(1, self.size())]:
            work.wait()

    # torch's _coalescing_manager brackets a batch of isends and irecvs with these when a
    # backend coalesces; the block's Work then covers every send and receive posted in it.
    def start_coalescing(self) -> None:
        self._coalesced = []

    def end_coalescing(self) -> dist.Work:
        works, self._coalesced = self._coalesced or [], None
        return _AllWork(works) if works else _completed(None)

    # -- helpers -----------------------------------------------------------------------

    @staticmethod
    def _one(op: str, tensors: list[torch.Tensor]) -> torch.Tensor:
        if len(tensors) != 1:
            raise ValueError(f"commd {op}: {len(tensors)} tensors; one per call")
        if tensors[0].device.type != "cpu":
            raise NotImplementedError(
                f"commd {op}: tensor on {tensors[0].device}; commd sends and receives CPU "
                "tensors (\"cpu:commd,cuda:nccl\" sends CUDA tensors through NCCL)")
        return tensors[0]

    def _post(self, op: str, start: Callable[[], Any], result: Any,
              then: Callable[[], None] | None) -> dist.Work:
        try:
            request = start()
        except Error as e:
            raise self._backend_error(op, e) from e

        def wrap(e: BaseException) -> BaseException:
            return self._backend_error(op, e) if isinstance(e, Error) else e
        work = _PendingWork(request, result, then, wrap)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work
