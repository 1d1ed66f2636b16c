"""The flight recorder from Python: `group.record(...)` and the `group.recorder` calls record
a collective that runs outside commd (here an all-reduce and an all-gather through the job's
store) into the rank's recorder; a real dump (`client.dump()`, the daemon's files) shows each
entry with its op, sizes, dtypes and state, an abandoned one included."""

from __future__ import annotations

import json

import numpy as np
import pytest

import commd
import ranks


def store_all_reduce(store, tag: str, rank: int, world: int, x: np.ndarray) -> None:
    """The collective "run elsewhere": every rank's x summed through the store, in place."""
    store.set(f"{tag}/{rank}", x.tobytes())
    keys = [f"{tag}/{r}" for r in range(world)]
    store.wait(keys, timeout=60.0)
    x[...] = sum(np.frombuffer(store.get(k), x.dtype).reshape(x.shape) for k in keys)


def store_barrier(store, tag: str, rank: int, world: int) -> None:
    store.set(f"{tag}/{rank}", b"")
    store.wait([f"{tag}/{r}" for r in range(world)], timeout=60.0)


def rank_files(dump: dict, world: int) -> list[dict]:
    files = sorted(f for f in dump["files"] if f.endswith(".json"))
    assert [f.rsplit("/", 1)[1] for f in files] == [f"rank{r}.json" for r in range(world)], files
    out = []
    for f in files:
        with open(f) as fh:
            out.append(json.load(fh))
    return out


def recorded(client, rank, world):
    group = client.join_group("rec", rank, world, timeout=60.0)
    store = client.store
    ids = []
    # The context manager: begun and started on entry, completed on a normal exit.
    x = np.full((4, 6), rank + 1, np.float32)
    with group.record("all_reduce", [x], [x], timeout_ms=5000) as rid:
        assert isinstance(rid, commd.RecordId)
        store_all_reduce(store, "ar", rank, world, x)
    assert (x == sum(range(1, world + 1))).all()
    ids.append(rid)
    # The calls by hand, tensors as (shape, dtype) pairs; an all-gather through the store.
    rec = group.recorder
    rid = rec.begin("all_gather", [((5,), "int64")], [((world, 5), "int64")])
    rec.started(rid)
    store.set(f"ag/{rank}", np.arange(5, dtype=np.int64).tobytes())
    store.wait([f"ag/{r}" for r in range(world)], timeout=60.0)
    rec.completed(rid)
    ids.append(rid)
    # A block that raises: the entry is abandoned and the exception propagates.
    buf = group.allocate_symmetric(64)
    view = buf.view("bfloat16", (3, 2))
    with pytest.raises(RuntimeError, match="peer lost"):
        with group.record("broadcast", [view], [view]) as rid:
            raise RuntimeError("peer lost")
    ids.append(rid)
    # Liveness without a collective: the heartbeat the dump shows moves.
    store_barrier(store, "recorded", rank, world)
    result = {"ids": [(i.record_id, i.collective_seq_id, i.bytes) for i in ids]}
    if rank == 0:
        before = rank_files(client.dump(group="rec"), world)
        rec.heartbeat()
        after = rank_files(client.dump(group="rec"), world)
        result.update(before=before, after=after)
    store_barrier(store, "dumped", rank, world)  # no rank leaves before the dumps
    return result


@pytest.mark.parametrize("world", [2, 3])
def test_recorded_collectives_are_in_the_dump(daemon, job, world):
    results = ranks.run(recorded, world, daemon.runtime_dir, job)
    before, after = results[0]["before"], results[0]["after"]
    for rank, dump in enumerate(before):
        entries = dump["entries"]
        # The symmetric allocation records nothing; the three recorded collectives are the
        # rank's only entries, at consecutive collective seqs.
        got = [(e["profiling_name"], e["input_sizes"], e["input_dtypes"], e["output_sizes"],
                e["output_dtypes"], e["state"], e["retired"], e["timeout_ms"])
               for e in entries]
        assert got == [
            ("nccl:all_reduce", [[4, 6]], ["Float"], [[4, 6]], ["Float"], "completed", True,
             5000),
            ("nccl:all_gather", [[5]], ["Long"], [[world, 5]], ["Long"], "completed", True, 0),
            # Abandoned: started, never completed, no longer tracked.
            ("nccl:broadcast", [[3, 2]], ["BFloat16"], [[3, 2]], ["BFloat16"], "started",
             True, 0),
        ], (rank, entries)
        ids = results[rank]["ids"]
        assert [e["record_id"] for e in entries] == [i[0] for i in ids]
        assert [e["collective_seq_id"] for e in entries] == [i[1] for i in ids] == [1, 2, 3]
        assert [e["commd"]["bytes"] for e in entries] == [i[2] for i in ids] == [
            4 * 6 * 4, 5 * 8, 3 * 2 * 2]
        assert [e["process_group"] for e in entries] == [["rec", "undefined"]] * 3
        assert all(e["duration_ms"] is not None for e in entries[:2]), entries
        counters = dump["commd"]["counters"]
        assert counters["collectives"] == 2 and counters["abandoned"] == 1, counters
        assert counters["per_op"] == {"all_reduce": 1, "all_gather": 1}, counters
        # Progress: the broadcast started and never completed.
        (status,) = dump["pg_status"].values()
        assert (status["last_enqueued_collective"], status["last_started_collective"],
                status["last_completed_collective"]) == (3, 3, 2), status
    assert after[0]["commd"]["heartbeat_ns"] > before[0]["commd"]["heartbeat_ns"]
    assert after[1]["commd"]["heartbeat_ns"] == before[1]["commd"]["heartbeat_ns"]
    # A heartbeat changes no entry. The daemon's watchdog (100 ms polls) may stamp when it
    # first saw an entry between the two dumps: a discovery time goes from None to a time,
    # and one already stamped never changes.
    discovered = ("time_discovered_started_ns", "time_discovered_completed_ns")
    for b, a in zip(before[0]["entries"], after[0]["entries"], strict=True):
        assert {k: v for k, v in a.items() if k not in discovered} == \
               {k: v for k, v in b.items() if k not in discovered}, (b, a)
        for k in discovered:
            assert b[k] is None or a[k] == b[k], (k, b, a)


def test_recorder_refuses_what_it_cannot_record(client):
    with client.join_group("solo", 0, 1, timeout=30.0) as group:
        with pytest.raises(commd.InvalidArgumentError, match="unknown op 'all_reduce_everything'"):
            group.recorder.begin("all_reduce_everything", [((4,), "float32")])
        with pytest.raises(commd.InvalidArgumentError, match="uint16 cannot be recorded"):
            group.recorder.begin("all_reduce", [((4,), "uint16")])
        with pytest.raises(commd.InvalidArgumentError, match="unknown dtype 'complex'"):
            group.recorder.begin("all_reduce", [((4,), "complex")])
        dump = client.dump(group="solo")
        (path,) = dump["files"]
        with open(path) as f:
            assert json.load(f)["entries"] == []


def test_recorder_records_every_type_of_the_vocabulary(client):
    # Every DataType can describe a recorded tensor (NCCL's collectives of any dtype), not
    # only the types commd's own collectives take; the dump names PyTorch's ScalarType.
    scalar = {"float64": "Double", "uint8": "Byte", "int8": "Char", "bool": "Bool",
              "int16": "Short", "bfloat16": "BFloat16"}
    with client.join_group("types", 0, 1, timeout=30.0) as group:
        for name in scalar:
            group.recorder.completed(group.recorder.begin("broadcast", [((3,), name)]))
        dump = client.dump(group="types")
        (path,) = dump["files"]
        with open(path) as f:
            entries = json.load(f)["entries"]
    assert [e["input_dtypes"] for e in entries] == [[v] for v in scalar.values()]


def test_parts_of_a_recorded_collective_are_its_one_entry(client):
    """Calls given part_of a recorded entry write none of their own: one entry of the whole
    collective's size; an id no longer pending, or not a RecordId, raises naming it."""
    with client.join_group("parts", 0, 1, timeout=30.0) as group:
        staging = group.allocate_symmetric(64)  # 16 float32: the 40 go in 3 parts
        a = np.arange(40, dtype=np.float32)
        with group.record("all_reduce", [((40,), "float32")], [((40,), "float32")]) as whole:
            for start in range(0, 40, 16):
                group.all_reduce(a[start:start + 16], staging=staging, part_of=whole)
        assert (a == np.arange(40)).all()  # a world of one: the sum is the input
        with pytest.raises(commd.InvalidArgumentError,
                           match=f"part_of record {whole.record_id} .collective seq 1. is not a "
                                 "pending collective entry of group parts"):
            group.all_reduce(a[:16], staging=staging, part_of=whole)
        with pytest.raises(commd.InvalidArgumentError, match="part_of must be a commd.RecordId"):
            group.all_reduce(a[:16], staging=staging, part_of=3)
        group.all_reduce(a[:16], staging=staging)
        (dump,) = rank_files(client.dump(group="parts"), 1)
        got = [(e["input_sizes"], e["state"], e["collective_seq_id"]) for e in dump["entries"]]
        assert got == [([[40]], "completed", 1), ([[16]], "completed", 2)], dump["entries"]


def test_started_and_completed_take_a_cuda_stream(client):
    """`started` / `completed` without a stream (cuda_stream None, the default) mark the entry
    now, as before; a stream marks it in that stream's order, which needs a usable CUDA driver:
    without one the stream is named in FailedPreconditionError and nothing is recorded, and
    group.record(cuda_stream=...) abandons its entry. A cuda_stream that is no handle is refused
    by name."""
    with client.join_group("streams", 0, 1, timeout=30.0) as group:
        rec = group.recorder
        rid = rec.begin("all_reduce", [((8,), "float32")], [((8,), "float32")])
        rec.started(rid, cuda_stream=None)
        with pytest.raises(commd.InvalidArgumentError,
                           match="cuda_stream must be None or a cudaStream_t as an int >= 0, "
                                 "not -1"):
            rec.completed(rid, cuda_stream=-1)
        with pytest.raises(commd.InvalidArgumentError, match="not 'stream'"):
            rec.completed(rid, cuda_stream="stream")
        rec.completed(rid)
        entries = [rid]
        if " device(s), " not in client.status().get("cuda_status", ""):
            # No usable driver here (the daemon runs in this environment): a stream cannot be
            # written to.
            rid = rec.begin("all_reduce", [((8,), "float32")], [((8,), "float32")])
            with pytest.raises(commd.FailedPreconditionError,
                               match="stream-ordered recording on stream 1234 needs a CUDA"):
                rec.started(rid, cuda_stream=0x1234)
            rec.abandoned(rid)
            entries.append(rid)
            with pytest.raises(commd.FailedPreconditionError, match="on stream 1234"):
                with group.record("all_gather", [((8,), "float32")], [((8,), "float32")],
                                  cuda_stream=0x1234):
                    pytest.fail("the block ran although the entry could not be started")
        (dump,) = rank_files(client.dump(group="streams"), 1)
        got = [(e["profiling_name"], e["state"], e["retired"]) for e in dump["entries"]]
        want = [("nccl:all_reduce", "completed", True)]
        if len(entries) > 1:  # the stream-ordered attempts: abandoned, never started
            want += [("nccl:all_reduce", "scheduled", True), ("nccl:all_gather", "scheduled", True)]
        assert got == want, dump["entries"]

