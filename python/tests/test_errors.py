"""Bad arguments and failures raise the right commd.Error subclass with a clear message."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import commd
import ranks


def test_error_hierarchy():
    for name, code in [("AbortedError", "ABORTED"), ("DeadlineExceededError", "DEADLINE_EXCEEDED"),
                       ("InvalidArgumentError", "INVALID_ARGUMENT"), ("DataLossError", "DATA_LOSS"),
                       ("UnavailableError", "UNAVAILABLE"), ("NotFoundError", "NOT_FOUND"),
                       ("AlreadyExistsError", "ALREADY_EXISTS"),
                       ("ResourceExhaustedError", "RESOURCE_EXHAUSTED"),
                       ("PermissionDeniedError", "PERMISSION_DENIED")]:
        cls = getattr(commd, name)
        assert issubclass(cls, commd.Error) and cls.code == code
        assert commd.errors._from_code(code, "m").__class__ is cls
    other = commd.errors._from_code("INTERNAL", "boom")
    assert type(other) is commd.Error and other.code == "INTERNAL" and str(other) == "boom"


def test_binding_argument_errors(client):
    group = client.join_group("args", 0, 1, timeout=30.0)
    buf = group.allocate_symmetric(1024)
    out = group.allocate_symmetric(1024)
    cases = [
        (lambda: group.all_reduce(buf.view("uint16", 8)), "dtype uint16 is not a collective type"),
        (lambda: group.all_reduce(buf.view("bool", 8), op="avg"),
         "reduce op avg is not defined on bool; allowed on bool: sum, min, max, product, band, bor, bxor"),
        (lambda: group.all_reduce(buf.view("float32", 8), dtype="int32"),
         "dtype int32 differs from a view's float32"),
        (lambda: group.all_reduce(buf.view("float32", 10), count=100),
         r"count 100 exceeds buf's 10 elements \(allowed: 0..10\)"),
        (lambda: group.all_reduce(buf), "dtype is required for whole buffers"),
        (lambda: group.all_reduce(buf.view("float32", 8), op="prod"),
         "unknown reduce op 'prod' \\(one of: sum, avg, min, max, product, band, bor, bxor\\)"),
        (lambda: group.all_reduce(np.zeros(4, np.float32)),
         "buf must be a commd.SymmetricBuffer or a view of one \\(got ndarray\\)"),
        (lambda: group.all_gather(buf.view("float32", 4, offset=16), out.view("float32", 4)),
         "all_gather takes views at offset 0 \\(input is at offset 16\\)"),
        (lambda: group.all_reduce(buf.view("float32", 8), timeout=-1.0), "timeout -1 s is negative"),
        (lambda: group.all_reduce(buf.view("float32", 8), nan_check="always"),
         "unknown nan_check 'always'"),
        (lambda: group.all_reduce_coalesced([buf.view("float32", 4), out.view("float32", 4)]),
         "tensors\\[1\\] views another buffer"),
        (lambda: client.join_group("x", 0, 2, watchdog_policy="explode"),
         "unknown watchdog_policy 'explode' \\(one of: default, report, notify, terminate\\)"),
    ]
    for call, message in cases:
        with pytest.raises(commd.InvalidArgumentError, match=message):
            call()
    # The SDK's own checks come through with its message unchanged.
    with pytest.raises(commd.InvalidArgumentError) as e:
        group.all_reduce(buf, 1000, "float32")
    assert e.value.code == "INVALID_ARGUMENT" and "1000" in str(e.value)
    group.close()
    with pytest.raises(commd.FailedPreconditionError, match="closed"):
        group.barrier()


def test_join_errors(daemon, job, client):
    with pytest.raises(commd.InvalidArgumentError):
        client.join_group("bad-rank", 5, 2, timeout=5.0)
    with pytest.raises(commd.DeadlineExceededError) as e:
        client.join_group("lonely", 0, 2, timeout=0.5)
    assert "1" in str(e.value)
    # A rank already taken: the first join waits for rank 1, a second rank 0 is refused.
    first = {}
    t = threading.Thread(target=lambda: first.setdefault(
        "g", commd.Client.connect(runtime_dir=daemon.runtime_dir, job_id=job).join_group(
            "taken", 0, 2, timeout=30.0)))
    t.start()
    other = commd.Client.connect(runtime_dir=daemon.runtime_dir, job_id=job)
    for _ in range(100):
        if any(g["name"] == "taken" for g in client.groups()):
            break
        threading.Event().wait(0.05)
    with pytest.raises(commd.AlreadyExistsError):
        other.join_group("taken", 0, 2, timeout=5.0)
    last = commd.Client.connect(runtime_dir=daemon.runtime_dir, job_id=job)
    g1 = last.join_group("taken", 1, 2, timeout=30.0)
    t.join(30)
    assert first["g"].world_size == 2 and g1.rank == 1


def mismatched(client, rank, world):
    group = client.join_group("mm", rank, world, timeout=60.0)
    buf = group.allocate_symmetric(1024)
    try:
        group.all_reduce(buf.view("float32", 8 + rank))
    except commd.InvalidArgumentError as e:
        return str(e)
    return "no error"


def test_mismatched_counts_fail_every_rank(daemon, job):
    for message in ranks.run(mismatched, 2, daemon.runtime_dir, job):
        assert "no error" != message and "rank" in message


def nan_fail(client, rank, world):
    group = client.join_group("nan", rank, world, timeout=60.0, nan_check="on",
                              nan_policy="fail")
    buf = group.allocate_symmetric(1024)
    x = np.asarray(buf.view("float32", 8))
    x[:] = 1.0
    if rank == 1:
        x[2] = np.inf
    try:
        group.all_reduce(buf.view("float32", 8))
    except commd.DataLossError as e:
        return e.code, str(e)
    return "no error", ""


def test_nan_policy_fail_raises_data_loss_on_every_rank(daemon, job):
    for code, message in ranks.run(nan_fail, 2, daemon.runtime_dir, job):
        assert code == "DATA_LOSS" and "1" in message
