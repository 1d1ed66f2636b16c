"""commd.torch's staging: the buffers a tensor outside symmetric memory is copied through,
and the one driver every collective runs by (_Stager._staged): zero copy when the tensors
live in the group's symmetric buffers, else one call through the staging buffers when the
tensor fits them, else in chunks under one flight-recorder entry."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from commd import Group

from ._tensors import _ITEMSIZE, _flat, _host, _nbytes, _write_back


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


class _Stager:
    """How ProcessGroupCommd runs a collective on tensors (a mixin of it: it reads the
    backend's `_group`, `_staging`, `_registry`, `_outer`, `_device`, `_timeout_ms`, `nodes`
    and `size()`)."""

    def _in_place_view(self, t: torch.Tensor, cdtype: str):
        """The commd view of `t` when it needs no staging, else None. Whether it does is the
        group's SymmetricRegistry's to say (commd._commd): the same lookup the C++ backend
        makes for the tensors torch hands it, so the two backends never disagree on which
        tensor is zero-copy. A tensor is one region of memory only when contiguous."""
        if not t.is_contiguous():
            return None
        buf = self._registry.find(t.data_ptr(), _nbytes(t))
        return None if buf is None else buf.view(cdtype, (t.numel(),))

    def _staged(self, call: str, src: torch.Tensor, dst: torch.Tensor, cdtype: str, *,
                in_slots: int = 1, out_slots: int = 1, write_back: bool = True,
                **kwargs: Any) -> None:
        """Runs commd's `call` (the SDK's name: all_reduce, broadcast, all_gather,
        reduce_scatter, all_to_all) from `src` into `dst`; `dst` is `src` for the ops in
        place. `src` holds `in_slots` blocks of one count of elements, `dst` `out_slots` (the
        world size for the blocks of an all-gather's output, a reduce-scatter's input, both
        of an all-to-all; else 1). `kwargs` go to the SDK's call (op=, root=). In order:
        - zero copy: every tensor starts a symmetric buffer of the group (_in_place_view):
          one call on their views;
        - one call: what the call stages fits one staging buffer;
        - else in pieces of every block, each piece a part of one flight-recorder entry.
        A result computed in a contiguous copy of a non-contiguous `dst` is written back
        unless `write_back` is False (a broadcast's root)."""
        in_place = src is dst
        views = [self._in_place_view(t, cdtype) for t in ((src,) if in_place else (src, dst))]
        if all(v is not None for v in views):
            getattr(self._group, call)(*views, part_of=self._outer, **kwargs)
            return
        count = src.numel() // in_slots
        itemsize = src.element_size()
        slots = max(in_slots, out_slots)
        if in_place:
            s = d = _flat(src)
        else:
            s = src.contiguous().view(in_slots, -1)
            d = dst.contiguous().view(out_slots, -1)
        # What one call stages: on a node-local CPU group the kernels copy the input into the
        # staging buffer and write results straight into `dst`; on CUDA and on a group
        # spanning nodes the results come back through the staging buffers too.
        node_local_host = self._device == "host" and self.nodes == 1
        one_call = in_slots if node_local_host else slots
        if 0 < count * itemsize * one_call <= self._staging.nbytes:
            self._outside(call, s, d, count, cdtype, out_slots=out_slots, **kwargs)
        else:
            pieces = self._chunks(count, itemsize, slots)
            with self._one_entry(pieces, call, cdtype, in_slots * count,
                                 out_slots * count) as whole:
                for start, n in pieces:
                    self._piece(call, s, d, start, n, cdtype, in_slots, out_slots, whole,
                                **kwargs)
        if write_back:
            _write_back(dst, d)

    def _piece(self, call: str, s: torch.Tensor, d: torch.Tensor, start: int, n: int,
               cdtype: str, in_slots: int, out_slots: int, whole: Any, **kwargs: Any) -> None:
        """Elements [start, start + n) of every block of _staged's contiguous `s` and `d`."""
        if s is d:  # in place: the piece is one contiguous slice, staged by the call
            piece = s[start:start + n]
            self._outside(call, piece, piece, n, cdtype, part_of=whole, **kwargs)
            return
        if in_slots == 1:  # the call stages the piece and writes into the second buffer
            self._outside(call, s[0, start:start + n],
                          self._staging.tensor(1, d.dtype, out_slots * n), n, cdtype,
                          out_slots=out_slots, part_of=whole, **kwargs)
        else:  # a piece of every block: packed into the first buffer, run on the buffers
            self._staging.tensor(0, s.dtype, in_slots * n).view(in_slots, n).copy_(
                s[:, start:start + n])
            getattr(self._group, call)(self._staging.view(0, cdtype, in_slots * n),
                                     self._staging.view(1, cdtype, out_slots * n),
                                     part_of=whole, **kwargs)
        d[:, start:start + n].copy_(
            self._staging.tensor(1, d.dtype, out_slots * n).view(out_slots, n))

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
