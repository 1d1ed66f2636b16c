"""Client, store and persistent buffers through the binding, against a real daemon."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import commd
import ranks


def test_status_topology_groups_health(client, daemon, job):
    status = client.status()
    assert status["version"]
    assert status["pid"] == daemon.proc.pid
    assert status["sessions"] >= 1
    assert status["runtime_dir"] == daemon.runtime_dir
    assert isinstance(client.topology(), dict)
    assert client.groups() == []
    assert client.health()["groups"] == []
    assert client.runtime_dir == daemon.runtime_dir
    assert client.job_id == job


def formed_group(client, rank, world):
    group = client.join_group("watched", rank, world, timeout=60.0)
    buf = group.allocate_symmetric(64)
    group.all_reduce(buf.view("float32", 4))
    group.barrier()
    return rank


def test_groups_health_dump_abort(client, daemon, job):
    ranks.run(formed_group, 2, daemon.runtime_dir, job)
    # The ranks left: the group is gone, but the dump of a running one is tested below.
    g = client.join_group("solo", 0, 1, timeout=30.0)
    buf = g.allocate_symmetric(64)
    g.all_reduce(buf.view("int32", 4))
    groups = client.groups()
    assert [x["name"] for x in groups] == ["solo"]
    assert groups[0]["world_size"] == 1 and groups[0]["job_id"] == job
    health = None
    for _ in range(200):  # the watchdog knows a group from its first poll on
        try:
            health = client.health(group="solo")
            break
        except commd.NotFoundError:
            time.sleep(0.05)
    assert health is not None, "the watchdog never listed group solo"
    assert [h["group"] for h in health["groups"]] == ["solo"]
    assert isinstance(health["groups"][0]["state"], str)
    dump = client.dump(group="solo")
    assert dump["entries"] >= 1, dump
    assert dump["files"] and all(f.startswith(daemon.dump_dir) for f in dump["files"])
    got = []
    g.on_abort(got.append)
    assert client.abort("solo", "python test says stop") == 1
    with pytest.raises(commd.AbortedError) as e:
        g.barrier()
    assert "python test says stop" in str(e.value)
    assert e.value.code == "ABORTED"
    assert g.abort_requested and "python test says stop" in g.abort_reason
    # The callback comes with the abort event on the SDK's event thread, which may run after the
    # barrier has already seen the abort word.
    for _ in range(200):
        if got:
            break
        time.sleep(0.05)
    assert len(got) == 1 and isinstance(got[0], commd.AbortedError)


def test_group_shape_on_one_node_and_spanning_without_a_cluster(client):
    # A group on this node only: its global shape is its own, with no layout.
    with client.join_group("local", 0, 1, timeout=10.0) as group:
        assert group.global_world_size == 1
        assert group.layout == []
        assert group.node_index == -1
    # A group spanning nodes needs the daemon's cluster, which this one has not.
    with pytest.raises(commd.FailedPreconditionError, match="which needs a cluster"):
        client.join_group("spans", 0, 1, global_rank=0, global_world_size=2, timeout=10.0)
    with pytest.raises(commd.InvalidArgumentError, match="allowed 0 .* or 1 to 16384"):
        client.join_group("huge", 0, 1, global_rank=0, global_world_size=1 << 30)


def test_store(client, daemon, job):
    s = client.store
    s.set("k", b"\x00bytes\xff")
    assert s.get("k") == b"\x00bytes\xff"
    s.set("text", "utf-8 ok")
    assert s.get("text") == b"utf-8 ok"
    assert s.add("n", 5) == 5 and s.add("n", -2) == 3
    assert s.get("n") == b"3"
    assert s.compare_set("c", b"", b"first") == b"first"
    assert s.compare_set("c", b"wrong", b"second") == b"first"
    assert s.compare_set("c", b"first", b"second") == b"second"
    s.wait(["k", "n"], timeout=5)
    s.wait("k")
    assert s.delete("k") is True and s.delete("k") is False
    with pytest.raises(commd.NotFoundError) as e:
        s.get("k")
    assert "k" in str(e.value) and e.value.code == "NOT_FOUND"
    with pytest.raises(commd.FailedPreconditionError):
        s.add("text", 1)
    with pytest.raises(commd.DeadlineExceededError) as e:
        s.wait(["never-set"], timeout=0.2)
    assert "never-set" in str(e.value)
    assert isinstance(e.value, TimeoutError)
    # Another job's keys are invisible.
    other = commd.Client.connect(runtime_dir=daemon.runtime_dir, job_id=job + "-other")
    with pytest.raises(commd.NotFoundError):
        other.store.get("n")


def attach_and_read(client, rank, world, name):
    buf = client.attach_persistent(name)
    return bytes(np.asarray(buf)[:16]), buf.size, buf.name


def test_persistent_buffers(client, daemon, job):
    buf = client.allocate_persistent("ckpt", 4096, ttl=30.0)
    assert buf.size == 4096 and buf.name == "ckpt" and len(buf) == 4096
    np.asarray(buf)[:16] = np.arange(16, dtype=np.uint8)
    typed = buf.view("float64", 4, offset=1024)
    np.asarray(typed)[:] = [1.5, 2.5, 3.5, 4.5]
    assert np.asarray(buf.view("float64", 4, offset=1024)).tolist() == [1.5, 2.5, 3.5, 4.5]
    (got,) = ranks.run(attach_and_read, 1, daemon.runtime_dir, job, "ckpt")
    assert got == (bytes(range(16)), 4096, "ckpt")
    with pytest.raises(commd.AlreadyExistsError) as e:
        client.allocate_persistent("ckpt", 64)
    assert "ckpt" in str(e.value)
    with pytest.raises(commd.NotFoundError):
        client.attach_persistent("no-such-buffer")
    client.delete_persistent("ckpt")
    with pytest.raises(commd.NotFoundError):
        client.attach_persistent("ckpt")


def test_connect_unavailable(tmp_path):
    with pytest.raises(commd.UnavailableError) as e:
        commd.Client.connect(runtime_dir=str(tmp_path), connect_timeout=0.2)
    assert str(tmp_path) in str(e.value) and e.value.code == "UNAVAILABLE"


def test_module_imports_without_torch_and_has_docs():
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None; "
            "import commd; print(commd.Group.all_reduce.__doc__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), check=True).stdout
    assert "Reduces `count` elements in place" in out
    stubs = os.path.join(os.path.dirname(commd.__file__), "_commd.pyi")
    assert os.path.exists(stubs)
