"""Symmetric buffers as Python sees them: buffer protocol, DLPack, peer views, bounds."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import commd
import ranks


def write_and_see_peer(client, rank, world):
    group = client.join_group("dl", rank, world, timeout=60.0)
    buf = group.allocate_symmetric(4096)
    view = buf.view("float32", (4, 8))
    mine = np.asarray(view)  # zero-copy via the buffer protocol, writable
    # numpy (< 2) marks DLPack imports read-only; same memory all the same.
    dl = np.from_dlpack(view)
    assert dl.shape == (4, 8) and dl.dtype == np.float32
    assert np.shares_memory(mine, np.asarray(buf)) and np.shares_memory(dl, mine)
    mine[...] = rank + np.arange(32, dtype=np.float32).reshape(4, 8)
    assert dl[1, 2] == rank + 10
    group.barrier()
    seen = []
    for r in range(world):
        peer = np.asarray(buf.view("float32", (4, 8), rank=r))
        seen.append(float(peer[1, 2]))
        assert np.asarray(buf.peer(r)).nbytes == 4096
    group.barrier()
    # A rank writes into its right neighbour's memory; the neighbour sees it in its own.
    right = (rank + 1) % world
    np.asarray(buf.view("int64", 1, offset=2048, rank=right))[0] = 1000 + rank
    group.barrier()
    got = int(np.asarray(buf.view("int64", 1, offset=2048))[0])
    return seen, got


@pytest.mark.parametrize("world", [2, 3])
def test_dlpack_zero_copy_and_peer_views(daemon, job, world):
    results = ranks.run(write_and_see_peer, world, daemon.runtime_dir, job)
    for rank, (seen, got) in enumerate(results):
        assert seen == [10.0 + r for r in range(world)]
        assert got == 1000 + (rank - 1) % world


def test_views_bounds_and_lifetime(client):
    group = client.join_group("views", 0, 1, timeout=30.0)
    buf = group.allocate_symmetric(4096)
    assert (buf.size, buf.rank, buf.world_size, buf.device) == (4096, 0, 1, "host")
    assert buf.__dlpack_device__() == (1, 0)
    v = buf.view("int32", (2, 3), offset=8)
    assert (v.shape, v.dtype, v.offset, v.count, v.nbytes) == ((2, 3), "int32", 8, 6, 24)
    assert memoryview(v).format == "i" and memoryview(v).shape == (2, 3)
    with pytest.raises(commd.InvalidArgumentError) as e:
        buf.view("float32", 1000, offset=100)
    assert "offset 100" in str(e.value) and "<= 4096" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(commd.InvalidArgumentError, match="offset 2 is not a multiple of float32's 4"):
        buf.view("float32", 1, offset=2)
    with pytest.raises(commd.InvalidArgumentError, match=r"rank 1 is out of range \(0..0\)"):
        buf.peer(1)
    with pytest.raises(commd.InvalidArgumentError, match="unknown dtype 'complex64'"):
        buf.view("complex64", 1)
    with pytest.raises(BufferError, match="bfloat16"):
        memoryview(buf.view("bfloat16", 4))
    with pytest.raises(BufferError):
        buf.__dlpack__(copy=True)
    # An exported array keeps the mapping alive after the buffer, view and group are gone.
    np.asarray(buf.view("float64", 8))[:] = 7.0
    arr = np.from_dlpack(buf.view("float64", 8))
    del v, buf
    group.close()
    del group
    assert arr.sum() == 56.0


TORCH_PYTHON = os.environ.get(
    "COMMD_TORCH_PYTHON", os.path.expanduser("~/.cache/commd/torch-venv/bin/python"))

TORCH_SCRIPT = r"""
import sys, numpy as np, torch, commd
client = commd.Client.connect(runtime_dir=sys.argv[1], job_id=sys.argv[2])
group = client.join_group("torch", 0, 1, timeout=30.0)
buf = group.allocate_symmetric(1024)
t = torch.from_dlpack(buf.view("bfloat16", (2, 4)))
t.fill_(1.5)
bits = np.asarray(buf.view("uint16", 8))
assert (bits == 0x3FC0).all(), bits
f = torch.from_dlpack(buf.view("float32", 16, offset=512))
np.asarray(buf.view("float32", 16, offset=512))[:] = 3.0
assert float(f.sum()) == 48.0
group.all_reduce(buf.view("float32", 16, offset=512), op="sum")
assert float(f.sum()) == 48.0
print("ok", torch.__version__)
"""


@pytest.mark.skipif(not os.path.exists(TORCH_PYTHON), reason="no torch virtualenv")
def test_torch_from_dlpack(daemon, job):
    env = dict(os.environ)
    r = subprocess.run([TORCH_PYTHON, "-c", TORCH_SCRIPT, daemon.runtime_dir, job],
                       capture_output=True, text=True, env=env, timeout=120)
    if "No module named 'torch'" in r.stderr:
        pytest.skip("torch not installed in " + TORCH_PYTHON)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")
