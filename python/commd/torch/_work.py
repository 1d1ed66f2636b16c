"""The Work a commd.torch collective returns (a leaf of commd.torch)."""

from __future__ import annotations

from typing import Any

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
