"""Real rank processes for the binding's tests: each runs a function of this module (or any
importable one) in a process of its own, started with multiprocessing's spawn."""

from __future__ import annotations

import multiprocessing
import traceback
from typing import Any, Callable


def _main(fn, rank, world, runtime_dir, job, args, queue) -> None:
    try:
        import commd

        client = commd.Client.connect(runtime_dir=runtime_dir, job_id=job)
        queue.put((rank, True, fn(client, rank, world, *args)))
    except BaseException as e:  # report everything, KeyboardInterrupt included
        queue.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run(fn: Callable[..., Any], world: int, runtime_dir: str, job: str, *args: Any,
        timeout: float = 120.0) -> list[Any]:
    """Runs fn(client, rank, world, *args) on `world` rank processes; returns the results by
    rank. Raises AssertionError with every failing rank's traceback."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_main, args=(fn, r, world, runtime_dir, job, args, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failures = []
    try:
        for _ in range(world):
            rank, ok, value = queue.get(timeout=timeout)
            if ok:
                results[rank] = value
            else:
                failures.append(f"rank {rank}: {value}")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    assert not failures, "\n".join(failures)
    return [results[r] for r in range(world)]



def refusals(messages: list[str]) -> Callable[[str, Callable[[], Any]], None]:
    """expect(needle, fn): fn() must raise commd.InvalidArgumentError whose message contains
    `needle`; the message is appended to `messages`."""
    def expect(needle: str, fn: Callable[[], Any]) -> None:
        import commd
        import pytest

        with pytest.raises(commd.InvalidArgumentError) as e:
            fn()
        assert needle in str(e.value), str(e.value)
        messages.append(str(e.value))
    return expect


def views(buf, dtype: str, shape, offset: int = 0, rank=None):
    """(typed view for the collectives, view numpy can hold): bfloat16 is held as its uint16
    bits, numpy having no bfloat16."""
    io = "uint16" if dtype == "bfloat16" else dtype
    return buf.view(dtype, shape, offset, rank), buf.view(io, shape, offset, rank)


def write(io_view, dtype: str, values) -> None:
    """Writes float64 `values` through numpy into `io_view` (zero-copy)."""
    import numpy as np

    a = np.asarray(io_view)
    if dtype == "bfloat16":  # truncation is exact for the small integers the tests use
        a[...] = (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    else:
        a[...] = np.asarray(values).astype(a.dtype)


def read(io_view, dtype: str):
    """`io_view`'s elements as float64."""
    import numpy as np

    a = np.asarray(io_view)
    if dtype == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)
