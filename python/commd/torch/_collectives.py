"""commd.torch's collectives: torch's Backend entry points of ProcessGroupCommd (a mixin of
it), each checking its arguments and running through the one staging driver
(_staging._Stager._staged)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ._tensors import _flat, _reduce_op_name, _write_back
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
        op = _reduce_op_name(opts.reduceOp, "allreduce")
        return self._run("allreduce", lambda: self._all_reduce(t, cdtype, op), tensors)

    def _all_reduce(self, t: torch.Tensor, cdtype: str, op: str) -> None:
        if op == "product":
            self._product(t, cdtype)
            return
        self._staged("all_reduce", t, t, cdtype, op=op)

    def _product(self, t: torch.Tensor, cdtype: str) -> None:
        """PRODUCT: commd reduces sum, avg, min and max; the product is taken here over an
        all-gather (each rank multiplies the world's values in rank order)."""
        world = self.size()
        flat = _flat(t)
        gathered = torch.empty((world, flat.numel()), dtype=t.dtype, device=t.device)
        self._staged("all_gather", flat, gathered, cdtype, out_slots=world)
        flat.copy_(torch.prod(gathered, dim=0).to(t.dtype))
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
        # The root's tensor is the result: nothing to write back there.
        self._staged("broadcast", t, t, cdtype, root=root, write_back=self.rank() != root)

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
        self._staged("reduce_scatter", input, output, cdtype, in_slots=self.size(), op=op)

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
        world = self.size()
        self._staged("all_to_all", input, output, cdtype, in_slots=world, out_slots=world)

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

