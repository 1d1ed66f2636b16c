"""CUDA tensors on backend "commd". The backend registers for cpu and cuda on every machine
(checked here); the collectives on CUDA tensors need a GPU per rank and are skipped without
one (this project's CI has none: the CUDA path is compiled, not run), as is
"cpu:commd,cuda:nccl", whose NCCL half torch creates only with a CUDA device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from test_backend import torchrun  # noqa: E402

JOB_WORKER = os.path.join(os.path.dirname(__file__), "job_worker.py")


def test_the_backend_registers_for_cpu_and_cuda():
    out = subprocess.run(
        [sys.executable, "-c", "import commd.torch, torch.distributed as dist; "
         "print(dist.Backend.backend_capability['commd'])"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['cpu', 'cuda']"


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="torch's nccl backend needs a CUDA device (\"nccl2 requires at least "
                    "one CUDA device\")")
def test_cpu_on_commd_cuda_on_nccl_still_works(daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "cpu_commd_cuda_nccl", 2, worker=JOB_WORKER)
    assert code == 0
    for r in results:
        assert r["groups"] == {"0": "default_pg"}, results  # no commd group for CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_tensors_staged_and_zero_copy_and_mixed_devices_refused(daemon, tmp_path):
    if torch.cuda.device_count() < 1:
        pytest.skip("no CUDA device")
    code, results = torchrun(daemon, tmp_path, "cuda", 2, worker=JOB_WORKER)
    assert code == 0
    for r in results:
        assert "tensors on cpu and cuda:" in r["mixed"], results
        assert "one collective takes tensors of one device" in r["mixed"], results
        assert r["whole"] == ["completed"], results  # the chunked all-reduce: one entry
        assert r["chunks"] == 0, results


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_an_entry_recorded_on_a_cuda_stream_follows_the_stream(client):
    """Group.record(cuda_stream=s) marks its entry started and completed in s's order (the
    Recorder's stream-ordered calls): once s is done, the group's progress words (pg_status)
    say the entry completed."""
    with client.join_group("on_stream", 0, 1, timeout=30.0, device="cuda:0") as group:
        stream = torch.cuda.Stream()
        with group.record("all_reduce", [((8,), "float32")], [((8,), "float32")],
                          cuda_stream=stream.cuda_stream):
            pass
        stream.synchronize()
        dump = client.dump(group="on_stream")
        (path,) = [f for f in dump["files"] if f.endswith(".json")]
        with open(path) as f:
            j = json.load(f)
        assert [e["state"] for e in j["entries"]] == ["completed"], j["entries"]
        (status,) = j["pg_status"].values()
        assert status["last_completed_collective"] == 1, j["pg_status"]
