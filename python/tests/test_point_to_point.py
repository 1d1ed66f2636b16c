"""Point-to-point on host memory (Group.send, recv, isend, irecv, batch_isend_irecv) between
real rank processes: exact contents for every collective type and sizes from nothing to
several staging pieces, a ring of isends posted before their irecvs, order within a tag and
independence across tags, what bad arguments and a hostile number of tags get, and how an
abort and a closed group end what is in flight."""

from __future__ import annotations

import numpy as np
import pytest

import commd
import ranks

# dtype -> numpy type holding it (bfloat16 as its bits).
HELD = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
        "bfloat16": np.uint16, "int8": np.int8, "uint8": np.uint8, "int16": np.int16,
        "int32": np.int32, "int64": np.int64, "bool": np.bool_}
# 0, 1, odd, and 3 MiB + 1 element of float32: four pieces of the 1 MiB staging buffer.
SIZES = [0, 1, 1001, (3 << 18) + 1]


def message(src: int, dst: int, n: int, dtype: str, salt: int = 0) -> np.ndarray:
    """What `src` sends `dst`: distinct per pair, size and salt, in range for every type."""
    i = np.arange(n, dtype=np.int64)
    values = (i * 7 + src * 31 + dst * 5 + salt * 11) % 100
    return (values % 2 if dtype == "bool" else values).astype(HELD[dtype])


def ring(client, rank, world):
    """Every rank posts its isend to the next rank before its irecv from the previous one, for
    every type and size, then waits for both in that order."""
    group = client.join_group("p", rank, world, timeout=60.0)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    checked = 0
    for dtype in HELD:
        for n in SIZES if dtype in ("float32", "uint8") else SIZES[:3]:
            out = message(rank, nxt, n, dtype)
            got = np.zeros(n, HELD[dtype])
            send = group.isend(out, nxt, dtype=dtype)
            recv = group.irecv(got, prev, dtype=dtype)
            send.wait()
            recv.wait()
            assert send.done() and recv.done()
            np.testing.assert_array_equal(got, message(prev, rank, n, dtype), err_msg=dtype)
            checked += 1
    group.barrier()
    return checked


def order_and_tags(client, rank, world):
    group = client.join_group("p", rank, world, timeout=60.0)
    if rank == 0:
        # Three messages on tag 0 in order; then tag 2 before tag 1, which rank 1 receives in
        # the other order: tags are independent channels.
        for salt in range(3):
            group.send(message(0, 1, 5, "int32", salt), 1)
        late = group.isend(message(0, 1, 5, "int32", 20), 1, tag=2)
        group.send(message(0, 1, 5, "int32", 10), 1, tag=1)
        late.wait()
        # A batch in both directions with rank 1, one request for all.
        got = np.zeros(4, np.int64)
        group.batch_isend_irecv([("send", message(0, 1, 4, "int64", 30), 1),
                                 ("recv", got, 1, 7)]).wait()
        np.testing.assert_array_equal(got, message(1, 0, 4, "int64", 31))
        names = [g["name"] for g in client.groups() if "/p2p/" in g["name"]]
        group.barrier()
        return names
    if rank == 1:
        for salt in range(3):
            got = np.zeros(5, np.int32)
            group.recv(got, 0)
            np.testing.assert_array_equal(got, message(0, 1, 5, "int32", salt))
        got1, got2 = np.zeros(5, np.int32), np.zeros(5, np.int32)
        group.recv(got1, 0, tag=1)
        group.recv(got2, 0, tag=2)
        np.testing.assert_array_equal(got1, message(0, 1, 5, "int32", 10))
        np.testing.assert_array_equal(got2, message(0, 1, 5, "int32", 20))
        got = np.zeros(4, np.int64)
        r = group.batch_isend_irecv([("recv", got, 0), ("send", message(1, 0, 4, "int64", 31), 0, 7)])
        r.wait()
        np.testing.assert_array_equal(got, message(0, 1, 4, "int64", 30))
    group.barrier()
    return []


def refused(client, rank, world):
    group = client.join_group("p", rank, world, timeout=60.0)
    messages: list[str] = []
    expect = ranks.refusals(messages)
    a = np.zeros(8, np.float32)
    expect("peer 2 is out of range (allowed: 0..1", lambda: group.isend(a, 2))
    expect("peer -1 is out of range (allowed: a rank of the group, or None for any source)",
           lambda: group.irecv(a, -1))
    expect("send: peer None names no rank", lambda: group.isend(a, None))
    expect(f"peer {rank} is this rank", lambda: group.send(a, rank))
    expect("tag -3 is out of range (allowed: 0..2147483647)", lambda: group.isend(a, 1 - rank, -3))
    expect("not a collective type", lambda: group.isend(np.zeros(8, np.uint16), 1 - rank))
    expect("count 9 exceeds buf's 8 elements (allowed: 0..8)",
           lambda: group.isend(a, 1 - rank, count=9))
    expect("must be writable", lambda: group.irecv(bytes(32), 1 - rank, dtype="float32"))
    expect("unknown point-to-point kind 'put'",
           lambda: group.batch_isend_irecv([("put", a, 1 - rank)]))
    # One bad op of a batch posts none of it: the good one's channel never forms, so the
    # peer's matching receive below would be the first message of that channel.
    expect("peer 5 is out of range",
           lambda: group.batch_isend_irecv([("send", a, 1 - rank, 3), ("send", a, 5)]))
    # Counts that differ: refused on both ranks, naming both, and the channel stays usable.
    if rank == 0:
        expect("ranks disagree", lambda: group.send(np.zeros(10, np.float32), 1, tag=3))
        group.send(np.arange(4, dtype=np.float32), 1, tag=3)
    else:
        expect("ranks disagree", lambda: group.recv(np.zeros(12, np.float32), 0, tag=3))
        got = np.zeros(4, np.float32)
        group.recv(got, 0, tag=3)
        np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32))
    group.barrier()
    return messages


def any_source(client, rank, world):
    """Rank 0 receives from any source: one message of every other rank on tag 4 (sent in
    reverse rank order, a sleep apart), each its sender's, beside a receive naming rank 1 on
    tag 6. Then, on a group with a 2 s timeout, one nobody sends, which ends at the timeout
    naming its tag, and one pending when the group is closed (CANCELLED). The other ranks
    stay until then (their exit would abort the groups)."""
    import time
    group = client.join_group("p", rank, world, timeout=60.0)
    if rank != 0:
        time.sleep(0.1 * (world - rank))
        group.send(message(rank, 0, 6, "int32"), 0, tag=4)
        if rank == 1:
            group.send(message(1, 0, 2, "int64", 9), 0, tag=6)
        client.join_group("q", rank, world, timeout=2.0)
        client.store.wait(["closed"], timeout=60.0)
        return None
    named_got = np.zeros(2, np.int64)
    named = group.irecv(named_got, 1, tag=6)
    senders = []
    for _ in range(world - 1):
        got = np.zeros(6, np.int32)
        r = group.irecv(got, None, tag=4)
        assert r.source() in (-1, *range(1, world))
        r.wait()
        np.testing.assert_array_equal(got, message(r.source(), 0, 6, "int32"))
        senders.append(r.source())
    named.wait()
    np.testing.assert_array_equal(named_got, message(1, 0, 2, "int64", 9))
    assert named.source() == 1
    short = client.join_group("q", rank, world, timeout=2.0)
    start = time.monotonic()
    with pytest.raises(commd.DeadlineExceededError) as late:
        short.recv(np.zeros(1, np.float32), None, tag=8)
    waited = time.monotonic() - start
    pending = short.irecv(np.zeros(1, np.float32), None, tag=9)
    short.close()
    with pytest.raises(commd.Error) as cancelled:
        pending.wait()
    client.store.set("closed", b"1")
    return {"senders": sorted(senders), "late": str(late.value), "waited": waited,
            "cancelled": [cancelled.value.code, str(cancelled.value)],
            "source": pending.source()}


def hostile_tags(client, rank, world):
    """Rank 0 posts a send on more tags than a rank may open channels; rank 1 never receives.
    The one past the limit is refused, and closing the group ends the rest (CANCELLED), with
    no thread or join left behind. Rank 1 stays until then (its exit would abort the group)."""
    group = client.join_group("p", rank, world, timeout=60.0)
    if rank != 0:
        client.store.wait(["closed"], timeout=60.0)
        return None
    a = np.zeros(1, np.float32)
    limit = commd.MAX_POINT_TO_POINT_CHANNELS
    pending = [group.isend(a, 1, tag=t) for t in range(limit)]
    with pytest.raises(commd.ResourceExhaustedError) as e:
        group.isend(a, 1, tag=limit)
    assert f"this rank has {limit} point-to-point channels open in group p" in str(e.value)
    group.close()
    codes = set()
    for r in pending:
        with pytest.raises(commd.Error) as e:
            r.wait()
        codes.add(e.value.code)
    with pytest.raises(commd.FailedPreconditionError):
        group.isend(a, 1)
    client.store.set("closed", b"1")
    return sorted(codes)


def aborted(client, rank, world):
    """Rank 1 waits for a message rank 0 never sends; rank 0 aborts the group: rank 1's wait
    ends with the group's abort, and a later send fails at once."""
    group = client.join_group("p", rank, world, timeout=60.0)
    group.barrier()
    if rank == 1:
        pending = group.irecv(np.zeros(3, np.float32), 0)
        group.barrier()
        with pytest.raises(commd.AbortedError) as e:
            pending.wait()
        with pytest.raises(commd.AbortedError) as later:
            group.isend(np.zeros(3, np.float32), 0)
        return [str(e.value), str(later.value)]
    group.barrier()
    client.abort("p", "stop the receive")
    return None


@pytest.mark.parametrize("world", [2, 3])
def test_a_ring_of_isends_before_irecvs_moves_every_type_and_size(daemon, job, world):
    checked = ranks.run(ring, world, daemon.runtime_dir, job)
    assert checked == [4 * 2 + 3 * 8] * world


def test_messages_keep_their_order_within_a_tag_and_tags_are_independent(daemon, job):
    names = ranks.run(order_and_tags, 2, daemon.runtime_dir, job)[0]
    assert sorted(names) == ["p/p2p/0-1/0", "p/p2p/0-1/1", "p/p2p/0-1/2", "p/p2p/1-0/7"]


def test_bad_arguments_are_refused_and_nothing_is_sent(daemon, job):
    messages = ranks.run(refused, 2, daemon.runtime_dir, job)
    assert len(messages[0]) == len(messages[1]) == 11
    # Both ranks name both counts, and which of the channel's ranks is which.
    for m in (messages[0][-1], messages[1][-1]):
        assert "10 x float32" in m and "12 x float32" in m, m
        assert "channel p/p2p/0-1/3, whose rank 0 is the sender" in m, m


@pytest.mark.parametrize("world", [2, 3])
def test_a_receive_from_any_source_takes_whichever_rank_sends(daemon, job, world):
    r = ranks.run(any_source, world, daemon.runtime_dir, job)[0]
    assert r["senders"] == list(range(1, world)), r
    assert "receive of 1 float32 from any rank (tag 8) in group q: no rank sent it within 2s" \
        in r["late"], r
    assert r["waited"] >= 1.9, r  # the group's timeout, not sooner
    assert r["cancelled"][0] == "CANCELLED" and "not yet matched" in r["cancelled"][1], r
    assert r["source"] == -1, r


def test_a_rank_gets_no_more_channels_than_the_limit_and_closing_ends_them(daemon, job):
    codes = ranks.run(hostile_tags, 2, daemon.runtime_dir, job)[0]
    assert codes == ["CANCELLED"]


def test_an_abort_ends_a_receive_in_flight_and_later_sends(daemon, job):
    texts = ranks.run(aborted, 2, daemon.runtime_dir, job)[1]
    assert "group p aborted" in texts[0] and "stop the receive" in texts[0], texts[0]
    assert "group p aborted" in texts[1], texts[1]
