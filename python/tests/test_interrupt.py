"""Ctrl-C (SIGINT) while a rank is blocked in the binding raises KeyboardInterrupt.

Timings are printed, never asserted tightly: the bound below only catches a hang. The latency
from SIGINT to KeyboardInterrupt is measured on CLOCK_MONOTONIC (time.monotonic(), one clock
for every process of the machine): the test reads it just before it sends the signal, the rank
as it catches KeyboardInterrupt (`ctest -V -R python_interrupt_test` prints it)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

RANK = r"""
import sys, time, commd
client = commd.Client.connect(runtime_dir=sys.argv[1], job_id=sys.argv[2])
what, rank = sys.argv[3], int(sys.argv[4])
if what == "join":
    print("blocked", flush=True)
    try:
        client.join_group("never", 0, 2, timeout=120.0)
    except KeyboardInterrupt:
        print(f"KeyboardInterrupt at {time.monotonic():.6f}", flush=True)
    sys.exit(0)
group = client.join_group("intr", rank, 2, timeout=120.0)
if what == "barrier":
    group.barrier()  # warm: the pads exist, the next barrier waits in the SDK's kernel
if rank == 1:
    time.sleep(float(sys.argv[5]))   # never reaches the barrier in time
    try:
        group.barrier()
    except commd.AbortedError as e:
        print("AbortedError", e, flush=True)
    sys.exit(0)
print("blocked", flush=True)
t0 = time.monotonic()
try:
    group.barrier()
    print("barrier returned", flush=True)
except KeyboardInterrupt:
    caught = time.monotonic()
    print(f"KeyboardInterrupt at {caught:.6f} after {caught - t0:.3f} s", flush=True)
    print("abort_requested", group.abort_requested, group.abort_reason, flush=True)
"""

HANG_BOUND = 30.0  # seconds: only a hang fails


def spawn(daemon, job, *args):
    return subprocess.Popen([sys.executable, "-c", RANK, daemon.runtime_dir, job, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt_when_blocked(proc):
    assert proc.stdout.readline().strip() == "blocked"
    time.sleep(0.5)  # let it enter the blocking call
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=HANG_BOUND)
    return out, err, time.monotonic() - sent, sent


def latency_ms(out: str, sent: float) -> float:
    """Milliseconds from SIGINT sent to KeyboardInterrupt caught in the rank (printed)."""
    caught = float(re.search(r"KeyboardInterrupt at ([0-9.]+)", out).group(1))
    return (caught - sent) * 1000


@pytest.mark.parametrize("what", ["barrier", "first"])
def test_ctrl_c_in_barrier_raises_and_aborts_the_group(daemon, job, what):
    # "first": the group's first barrier, which waits in the daemon's allocation rendezvous.
    waiter = spawn(daemon, job, what, 0)
    late = spawn(daemon, job, what, 1, 5)
    out, err, took, sent = interrupt_when_blocked(waiter)
    assert waiter.returncode == 0, err
    assert "KeyboardInterrupt at" in out, out + err
    print(f"{what}: SIGINT -> KeyboardInterrupt: {latency_ms(out, sent):.1f} ms; "
          f"-> process exit: {took:.3f} s; {out.strip()}")
    assert "abort_requested True" in out and "KeyboardInterrupt in barrier" in out
    late_out, late_err = late.communicate(timeout=HANG_BOUND)
    assert "AbortedError" in late_out and "KeyboardInterrupt" in late_out, late_out + late_err


def test_ctrl_c_in_join_group(daemon, job):
    proc = spawn(daemon, job, "join", 0)
    out, err, took, sent = interrupt_when_blocked(proc)
    assert proc.returncode == 0, err
    assert "KeyboardInterrupt at" in out, out + err
    print(f"join_group: SIGINT -> KeyboardInterrupt: {latency_ms(out, sent):.1f} ms; "
          f"-> process exit: {took:.3f} s")
