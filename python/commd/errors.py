"""commd's exceptions: one hierarchy under commd.Error, by gRPC status code.

Every error the SDK returns is raised as the subclass of its code, carrying the SDK's
message unchanged and the code's name in ``.code`` (e.g. ``"ABORTED"``).
"""

from __future__ import annotations


class Error(Exception):
    """An error from commd. ``code`` is the gRPC status code's name, ``message`` the text."""

    code: str = "UNKNOWN"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class AbortedError(Error):
    """The group was aborted (watchdog, Client.abort, a rank left or was interrupted)."""

    code = "ABORTED"


class DeadlineExceededError(Error, TimeoutError):
    """A wait ran past its timeout; the message names who never came."""

    code = "DEADLINE_EXCEEDED"


class InvalidArgumentError(Error, ValueError):
    """A bad argument, or ranks that called a collective with different arguments."""

    code = "INVALID_ARGUMENT"


class DataLossError(Error):
    """A NaN/Inf check found one under NaN policy 'fail'; the message names the ranks."""

    code = "DATA_LOSS"


class UnavailableError(Error):
    """The daemon is not reachable; the message names the socket."""

    code = "UNAVAILABLE"


class NotFoundError(Error):
    """No such key, group or buffer (of this job)."""

    code = "NOT_FOUND"


class AlreadyExistsError(Error):
    """The name or rank is taken."""

    code = "ALREADY_EXISTS"


class ResourceExhaustedError(Error):
    """A limit of the daemon's config was hit; the message names the config field."""

    code = "RESOURCE_EXHAUSTED"


class PermissionDeniedError(Error):
    """The caller's uid may not do this."""

    code = "PERMISSION_DENIED"


class FailedPreconditionError(Error):
    """The object is not in a state for this call (e.g. a closed group, a non-integer add)."""

    code = "FAILED_PRECONDITION"


class OutOfRangeError(Error):
    """A value left its range (e.g. Store.add overflowing int64)."""

    code = "OUT_OF_RANGE"


class UnimplementedError(Error):
    """Not supported by this build of the SDK (e.g. CUDA collectives without CUDA)."""

    code = "UNIMPLEMENTED"


_BY_CODE = {
    cls.code: cls
    for cls in (
        AbortedError,
        DeadlineExceededError,
        InvalidArgumentError,
        DataLossError,
        UnavailableError,
        NotFoundError,
        AlreadyExistsError,
        ResourceExhaustedError,
        PermissionDeniedError,
        FailedPreconditionError,
        OutOfRangeError,
        UnimplementedError,
    )
}


def _from_code(code: str, message: str) -> Error:
    """The exception (not raised) for a status: its code's subclass, else Error itself."""
    cls = _BY_CODE.get(code)
    return cls(message) if cls is not None else Error(message, code)


__all__ = ["Error"] + sorted(cls.__name__ for cls in _BY_CODE.values())
