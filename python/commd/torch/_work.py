"""The Work a commd.torch collective returns (a leaf of commd.torch)."""

from __future__ import annotations

import datetime
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist


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


class _PendingWork(dist.Work):
    """The Work of sends and receives in flight (a commd.PointToPointRequest): a thread waits
    for them, runs `then` (a receive's copy into a non-contiguous tensor) and completes the
    future with `result`, or with the failure `wrap` makes of their error. wait() blocks until
    then and raises that failure; torch's holder takes the future at once (docs/torch.md
    "Work"), which completes without anyone waiting."""

    def __init__(self, request: Any, result: Any, then: Callable[[], None] | None,
                 wrap: Callable[[BaseException], BaseException]) -> None:
        super().__init__()
        self._future: torch.futures.Future = torch.futures.Future()
        self._error: BaseException | None = None
        self._request = request
        self._thread = threading.Thread(target=self._finish, args=(request, result, then, wrap),
                                        name="commd-p2p-work", daemon=True)
        self._thread.start()

    def _finish(self, request: Any, result: Any, then: Callable[[], None] | None,
                wrap: Callable[[BaseException], BaseException]) -> None:
        try:
            request.wait()
            if then is not None:
                then()
        except Exception as e:  # noqa: BLE001 (handed to the waiter)
            self._error = wrap(e)
            self._future.set_exception(self._error)
            return
        self._future.set_result(result)

    def _source_rank(self) -> int:
        """The rank a receive's message came from (torch's recv without src reads it after
        wait()): the sender a receive from any source took its message from."""
        return self._request.source()

    def done_within(self, seconds: float) -> bool:
        """Whether the messages are done (failed or not) within `seconds` from now."""
        self._thread.join(max(seconds, 0.0))
        return not self._thread.is_alive()

    def wait(self, timeout: Any = None) -> bool:
        # torch's convention: no timeout, or a zero one (kNoTimeout), waits for good.
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0.0
        self._thread.join(seconds if seconds > 0 else None)
        if self._thread.is_alive():
            raise dist.DistBackendError(
                f"commd send/recv: not done within {timeout}; it goes on, bounded by the "
                "group's timeout")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._future.done()

    def exception(self) -> BaseException | None:
        return self._error


class _AllWork(dist.Work):
    """Works that complete together (the sends and receives of one coalesced block)."""

    def __init__(self, works: list[dist.Work]) -> None:
        super().__init__()
        self._works = works
        self._future = torch.futures.collect_all([w.get_future() for w in works]).then(
            lambda f: [x.value() for x in f.value()])

    def wait(self, timeout: Any = None) -> bool:
        for w in self._works:
            w.wait(timeout)
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)
