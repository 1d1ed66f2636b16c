"""A blocking collective releases the GIL: while rank 0's main thread waits in an all-reduce
for a peer that has not come, another Python thread of rank 0 runs. The peer comes only once
that thread has seen (in a real dump) rank 0's all-reduce started and has counted its
iterations, so with the GIL held through the wait the job could not finish: the all-reduce
would end at the group's timeout with DeadlineExceededError instead."""

from __future__ import annotations

import json
import threading
import time

import numpy as np

import ranks

ITERATIONS = 100_000  # pure-Python steps the thread takes while rank 0 waits
TIMEOUT = 30.0  # the group's: only a GIL held through the wait reaches it


def last_entry(client, rank: int) -> dict | None:
    dump = client.dump(group="gil")
    (path,) = [f for f in dump["files"] if f.endswith(f"/rank{rank}.json")]
    with open(path) as f:
        entries = json.load(f)["entries"]
    return entries[-1] if entries else None


def waiter_and_late_peer(client, rank, world):
    group = client.join_group("gil", rank, world, timeout=TIMEOUT)
    buf = group.allocate_symmetric(64)
    view, io = ranks.views(buf, "float32", 4)
    ranks.write(io, "float32", np.full(4, rank + 1.0))
    group.barrier()  # the signal pads exist: the all-reduce below waits in the SDK's kernel
    store = client.store
    if rank != 0:
        store.wait(["counted"], timeout=120.0)  # only once rank 0's thread ran
        group.all_reduce(view)
        return {"sum": ranks.read(io, "float32").tolist()}
    seen = {}

    def counter():
        # Until rank 0's own recorder shows its all-reduce started (recorded when its message
        # is out, before its first wait), then count while the main thread waits.
        deadline = time.monotonic() + 60
        polls = 0
        while True:
            polls += 1
            e = last_entry(client, 0)
            if e is not None and e["profiling_name"] == "nccl:all_reduce":
                seen["state"] = e["state"]
                break
            if time.monotonic() > deadline:
                seen["state"] = None
                store.set("counted", b"gave up")
                return
            time.sleep(0.01)
        t0 = time.monotonic()
        count = 0
        while count < ITERATIONS:
            count += 1
        seen.update(count=count, polls=polls, seconds=time.monotonic() - t0)
        # Still waiting: the peer has not been let in yet.
        seen["state_after"] = last_entry(client, 0)["state"]
        store.set("counted", str(count))

    thread = threading.Thread(target=counter)
    thread.start()
    group.all_reduce(view)  # waits for rank 1, which waits for the thread
    thread.join()
    return dict(seen, sum=ranks.read(io, "float32").tolist())


def test_a_thread_runs_while_a_collective_waits_for_a_late_peer(daemon, job):
    waiter, late = ranks.run(waiter_and_late_peer, 2, daemon.runtime_dir, job)
    print(f"rank 0's thread: {waiter.get('polls')} dump polls until its all-reduce showed "
          f"started, then {waiter.get('count')} iterations in {waiter.get('seconds', 0):.3f} s "
          "while the main thread waited")
    assert waiter["state"] == "started" and waiter["state_after"] == "started", waiter
    assert waiter["count"] == ITERATIONS > 0, waiter
    assert waiter["sum"] == late["sum"] == [3.0] * 4, (waiter, late)
