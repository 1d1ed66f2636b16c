"""commd.torch's collectives: torch's Backend entry points of ProcessGroupCommd (a mixin of
it), each checking its arguments and running through the one staging driver
(_staging._Stager._staged)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ._tensors import _reduce_op_name
from ._work import _completed


class _Collectives:
    """torch's collectives on a commd group (a mixin of ProcessGroupCommd, whose _run,
    _check, _pairwise, _entry and _staged they call)."""

    # -- all-reduce ----------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        if len(tensors) != 1:
            raise ValueError(f"commd allreduce: {len(tensors)} tensors; one per call")
        t = tensors[0]
        cdtype = self._check("allreduce", tensors)
        op = _reduce_op_name(opts.reduceOp, "allreduce", t.dtype)
        return self._run("allreduce", lambda: self._all_reduce(t, cdtype, op), tensors)

    def _all_reduce(self, t: torch.Tensor, cdtype: str, op: str) -> None:
        self._staged("all_reduce", t, t, cdtype, op=op)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        """One commd coalesced all-reduce for the tensors, when they fit the staging buffer
        together; else one all-reduce per tensor, each a part of the call's one
        flight-recorder entry."""
        cdtype = self._check("allreduce_coalesced", tensors)
        op = _reduce_op_name(opts.reduceOp, "allreduce_coalesced", tensors[0].dtype)
        return self._run("allreduce_coalesced",
                         lambda: self._all_reduce_coalesced(tensors, cdtype, op), tensors)

    def _all_reduce_coalesced(self, tensors: list[torch.Tensor], cdtype: str, op: str) -> None:
        itemsize = tensors[0].element_size()
        total = sum(t.numel() for t in tensors)
        if total * itemsize > self._staging.nbytes:
            counts = [(t.numel(), cdtype) for t in tensors]
            with self._entry("all_reduce", counts, counts):
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

    # -- broadcast -------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        if len(tensors) != 1:
            raise ValueError(f"commd broadcast: {len(tensors)} tensors; one per call")
        t = tensors[0]
        cdtype = self._check("broadcast", tensors)
        root = opts.rootRank
        return self._run("broadcast", lambda: self._broadcast(t, cdtype, root), tensors)

    def _broadcast(self, t: torch.Tensor, cdtype: str, root: int) -> None:
        # The root's tensor is the result: nothing to write back there.
        self._staged("broadcast", t, t, cdtype, root=root, write_back=self.rank() != root)

    # -- the rooted collectives, composed of the SDK's (commd has no rooted kernels yet) ----
    # Each is one flight-recorder entry under torch's name, whose parts are the SDK calls it
    # runs. Every rank moves what the all-rank form moves (world x count), so they cost what
    # all_reduce, all_gather and broadcast of the whole do.

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        if len(tensors) != 1:
            raise ValueError(f"commd reduce: {len(tensors)} tensors; one per call")
        t = tensors[0]
        cdtype = self._check("reduce", tensors)
        op = _reduce_op_name(opts.reduceOp, "reduce", t.dtype)
        return self._run("reduce", lambda: self._reduce(t, cdtype, op, opts.rootRank), tensors)

    def _reduce(self, t: torch.Tensor, cdtype: str, op: str, root: int) -> None:
        """An all-reduce whose result the root keeps; the others reduce a copy, so their
        tensors stay as they were."""
        counts = [(t.numel(), cdtype)]
        with self._entry("reduce", counts, counts):
            self._all_reduce(t if self.rank() == root else t.clone(), cdtype, op)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any) -> dist.Work:
        if len(inputs) != 1:
            raise ValueError(f"commd gather: {len(inputs)} input tensors; one per call")
        t, world = inputs[0], self.size()
        out = list(outputs[0]) if self.rank() == opts.rootRank and outputs else []
        if self.rank() == opts.rootRank and len(out) != world:
            raise ValueError(f"commd gather: the root's gather list has {len(out)} tensors; "
                             f"the group has {world} ranks")
        cdtype = self._check("gather", [t] + out)
        self._same_sizes("gather", t, out)
        counts = [(t.numel(), cdtype)]
        return self._run("gather", lambda: self._in_entry(
            "gather", counts, [(t.numel() * world, cdtype)],
            lambda: self._all_gather(out, t, cdtype)), outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any) -> dist.Work:
        if len(outputs) != 1:
            raise ValueError(f"commd scatter: {len(outputs)} output tensors; one per call")
        t, world, root = outputs[0], self.size(), opts.rootRank
        ins = list(inputs[0]) if self.rank() == root and inputs else []
        if self.rank() == root and len(ins) != world:
            raise ValueError(f"commd scatter: the root's scatter list has {len(ins)} tensors; "
                             f"the group has {world} ranks")
        cdtype = self._check("scatter", [t] + ins)
        self._same_sizes("scatter", t, ins)
        return self._run("scatter", lambda: self._scatter(t, ins, cdtype, root), outputs)

    def _scatter(self, t: torch.Tensor, ins: list[torch.Tensor], cdtype: str, root: int) -> None:
        """A broadcast of the root's blocks, of which each rank keeps its own."""
        n, world = t.numel(), self.size()
        whole = (torch.cat([i.reshape(-1) for i in ins]) if ins
                 else torch.empty(world * n, dtype=t.dtype, device=t.device))
        with self._entry("scatter", [(n * world, cdtype)], [(n, cdtype)]):
            self._broadcast(whole, cdtype, root)
        t.copy_(whole[self.rank() * n:(self.rank() + 1) * n].view(t.shape))

    def _in_entry(self, op: str, inputs: list[tuple[int, str]], outputs: list[tuple[int, str]],
                  call: Any) -> None:
        with self._entry(op, inputs, outputs):
            call()

    @staticmethod
    def _same_sizes(op: str, t: torch.Tensor, others: list[torch.Tensor]) -> None:
        for o in others:
            if o.numel() != t.numel():
                raise ValueError(f"commd {op}: a tensor of {o.numel()} elements in the list; "
                                 f"this rank's has {t.numel()} (every tensor the same size)")

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

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        """torch's all_gather_coalesced: outputs[r][j] receives rank r's inputs[j]; one
        all-gather per input, parts of one entry."""
        world = self.size()
        if len(outputs) != world or any(len(o) != len(inputs) for o in outputs):
            raise ValueError(f"commd allgather_coalesced: {len(outputs)} output lists of "
                             f"{[len(o) for o in outputs]} tensors; it takes one list a rank "
                             f"({world}), each with a tensor per input ({len(inputs)})")
        cdtype = self._check("allgather_coalesced", list(inputs) + [t for o in outputs for t in o])
        for j, t in enumerate(inputs):
            self._same_sizes("allgather_coalesced", t, [o[j] for o in outputs])
        counts = [(t.numel(), cdtype) for t in inputs]

        def run() -> None:
            for j, t in enumerate(inputs):
                self._all_gather([o[j] for o in outputs], t, cdtype)
        return self._run("allgather_coalesced", lambda: self._in_entry(
            "all_gather", counts, [(n * world, d) for n, d in counts], run), outputs)

    def _all_gather_single(self, output: torch.Tensor, t: torch.Tensor, cdtype: str) -> None:
        self._staged("all_gather", t, output, cdtype, out_slots=self.size())

    def _all_gather(self, out: list[torch.Tensor], t: torch.Tensor, cdtype: str) -> None:
        """The list form: gathered into one tensor, then copied to each output."""
        world = self.size()
        gathered = torch.empty((world, t.numel()), dtype=t.dtype, device=t.device)
        self._staged("all_gather", t, gathered, cdtype, out_slots=world)
        for o, block in zip(out, gathered):
            o.copy_(block.view(o.shape))

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
        op = _reduce_op_name(opts.reduceOp, "reduce_scatter", out.dtype)
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
        op = _reduce_op_name(opts.reduceOp, "reduce_scatter_tensor", output.dtype)
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
        self._staged("reduce_scatter", input, output, cdtype, in_slots=self.size(), op=op)

    # -- all-to-all ---------------------------------------------------------------------

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_splits: list[int], input_splits: list[int],
                          opts: Any) -> dist.Work:
        """Equal splits: one all-to-all. Uneven ones (rows of dim 0 to and from each rank, as
        torch's splits are): _all_to_all_chunks."""
        world = self.size()
        cdtype = self._check("all_to_all_single", [input, output])
        if not input_splits and not output_splits:
            if input.numel() != output.numel() or input.numel() % world != 0:
                raise ValueError(
                    f"commd all_to_all_single: input ({input.numel()} elements) and output "
                    f"({output.numel()}) must be the same size, a multiple of world_size "
                    f"({world}) when no splits are given")
            return self._run("all_to_all_single",
                             lambda: self._all_to_all(output, input, cdtype), output)
        ins = self._split("input", input, input_splits)
        outs = self._split("output", output, output_splits)

        def run() -> None:
            flat = torch.empty(output.numel(), dtype=output.dtype, device=output.device)
            self._all_to_all_chunks(list(flat.split([o.numel() for o in outs])), ins, cdtype)
            output.copy_(flat.view(output.shape))
        return self._run("all_to_all_single", lambda: self._in_entry(
            "all_to_all", [(input.numel(), cdtype)], [(output.numel(), cdtype)], run), output)

    alltoall_base = all_to_all_single

    def _split(self, name: str, t: torch.Tensor, splits: list[int]) -> list[torch.Tensor]:
        """`t`'s rows (dim 0) in `splits` (empty: equal), as flat chunks."""
        world = self.size()
        rows = t.shape[0] if t.dim() > 0 else 1
        if not splits:
            if rows % world != 0:
                raise ValueError(f"commd all_to_all_single: {name} of {rows} rows is not a "
                                 f"multiple of world_size ({world}) and no {name} splits "
                                 "are given")
            splits = [rows // world] * world
        if len(splits) != world or any(s < 0 for s in splits) or sum(splits) != rows:
            raise ValueError(f"commd all_to_all_single: {name} splits {list(splits)}; they "
                             f"must be {world} counts >= 0 summing to the {name}'s {rows} rows")
        row = math.prod(t.shape[1:]) if t.dim() > 0 else 1
        return list(t.contiguous().view(-1).split([s * row for s in splits]))

    def _all_to_all(self, output: torch.Tensor, input: torch.Tensor, cdtype: str) -> None:
        world = self.size()
        self._staged("all_to_all", input, output, cdtype, in_slots=world, out_slots=world)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any) -> dist.Work:
        """The list form: outputs[p] receives rank p's inputs[this rank], any sizes."""
        world = self.size()
        if len(outputs) != world or len(inputs) != world:
            raise ValueError(f"commd all_to_all: {len(inputs)} inputs and {len(outputs)} "
                             f"outputs; it takes one of each a rank ({world})")
        cdtype = self._check("all_to_all", list(inputs) + list(outputs))
        ins = [t.reshape(-1) for t in inputs]
        counts = ([(sum(t.numel() for t in inputs), cdtype)],
                  [(sum(t.numel() for t in outputs), cdtype)])
        return self._run("all_to_all", lambda: self._in_entry(
            "all_to_all", *counts, lambda: self._all_to_all_chunks(list(outputs), ins, cdtype)),
            outputs)

    def _all_to_all_chunks(self, outs: list[torch.Tensor], ins: list[torch.Tensor],
                           cdtype: str) -> None:
        """ins[p] to rank p, rank p's ins[this rank] into outs[p], of any sizes: each chunk
        padded to the group's largest (agreed by a max all-reduce of one int64), then one
        all-to-all of the padded blocks, world x largest elements a rank."""
        world, dtype, device = self.size(), ins[0].dtype, ins[0].device
        largest = torch.tensor([max(t.numel() for t in ins + outs)], dtype=torch.int64,
                               device=device)
        self._staged("all_reduce", largest, largest, "int64", op="max")
        m = int(largest.item())
        if m == 0:
            return
        padded = torch.zeros((world, m), dtype=dtype, device=device)
        for p, t in enumerate(ins):
            padded[p, :t.numel()] = t
        got = torch.empty((world, m), dtype=dtype, device=device)
        self._staged("all_to_all", padded, got, cdtype, in_slots=world, out_slots=world)
        for p, o in enumerate(outs):
            if o.numel() > 0:
                o.copy_(got[p, :o.numel()].view(o.shape))

    # -- barrier ------------------------------------------------------------------------

    def barrier(self, opts: Any) -> dist.Work:
        return self._run("barrier", self._group.barrier, None)

    # -- what commd does not do ---------------------------------------------------------

    def _unsupported(name: str):  # noqa: N805 (builds methods below)
        def method(self, *args: Any, **kwargs: Any) -> dist.Work:
            raise NotImplementedError(
                f"commd does not support {name}; supported: all_reduce, "
                "all_reduce_coalesced, broadcast, reduce, all_gather, all_gather_into_tensor, "
                "all_gather_coalesced, gather, scatter, reduce_scatter, reduce_scatter_tensor, "
                "all_to_all, all_to_all_single, barrier, monitored_barrier, send, recv")
        method.__name__ = name
        return method

    allreduce_sparse = _unsupported("allreduce_sparse")
    del _unsupported

