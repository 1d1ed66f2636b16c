"""The torch.distributed backend "commd" under torchrun, against a real daemon: each test
starts `torchrun --standalone` with worker.py's scenario and reads what the ranks wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(__file__), "worker.py")


def torchrun(daemon, tmp_path, scenario: str, nproc: int, *args: str,
             env: dict[str, str] | None = None, timeout: float = 600,
             worker: str = WORKER) -> tuple[int, list]:
    """Runs the scenario of `worker` on `nproc` ranks; returns torchrun's exit code and each
    rank's JSON (None for a rank that wrote none)."""
    out = tmp_path / scenario
    out.mkdir(parents=True)
    run_env = dict(os.environ, COMMD_RUNTIME_DIR=daemon.runtime_dir, OMP_NUM_THREADS="1",
                   COMMD_TORCH_CHUNK_BYTES=str(1 << 20), **(env or {}))
    run_env.pop("COMMD_JOB_ID", None)  # the backend makes one per torchrun job
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc-per-node={nproc}", "--monitor-interval=5", worker, scenario, str(out),
         *args],
        env=run_env, timeout=timeout, capture_output=True, text=True)
    results = []
    for r in range(nproc):
        path = out / f"rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
    if proc.returncode != 0:
        print(proc.stdout[-20000:], proc.stderr[-20000:], sep="\n")
    return proc.returncode, results


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_op_dtype_and_reduce_op_against_float64(daemon, tmp_path, world):
    code, results = torchrun(daemon, tmp_path, "ops_matrix", world)
    assert code == 0
    assert all(r["checked"] > 100 for r in results), results


def test_coalescing_manager_is_one_flight_recorder_entry(daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "coalesced", 2)
    assert code == 0
    for r in results:
        large = r["large"]
        # Each block one entry with every tensor's size, named after torch's default group
        # "0", between the barriers; the last block's tensors do not fit the 1 MiB staging
        # buffer together and run as chunked all-reduces, parts of the block's entry.
        assert r["entries"][1:-1] == [
            ["nccl:all_reduce", [[3], [1000]], [[3], [1000]], "completed"],
            ["nccl:all_gather", [[2], [3]], [[4], [6]], "completed"],
            ["nccl:reduce_scatter", [[4], [6]], [[2], [3]], "completed"],
            ["nccl:all_reduce", [[large], [7]], [[large], [7]], "completed"],
        ], r["entries"]
        assert [e[0] for e in (r["entries"][0], r["entries"][-1])] == ["nccl:barrier"] * 2, r
        assert [pg[0] for pg in r["process_groups"]] == ["0"], r


@pytest.mark.parametrize("world", [2, 3])
def test_rooted_uneven_and_object_collectives_and_checkpoint(daemon, tmp_path, world):
    code, results = torchrun(daemon, tmp_path, "rooted_and_objects", world)
    assert code == 0
    # 5 dtypes x world roots x (5 or 7 reduce ops + gather + scatter), then 8 more.
    ops = {torch.float32: 5, torch.bfloat16: 5, torch.int64: 7, torch.uint8: 7, torch.bool: 7}
    want = sum(world * (n + 2) for n in ops.values()) + 8
    assert [r["checked"] for r in results] == [want] * world, results


@pytest.mark.parametrize("world", [2, 3])
def test_send_recv_and_a_pipeline_schedule_equal_gloo(daemon, tmp_path, world):
    code, results = torchrun(daemon, tmp_path, "point_to_point", world)
    assert code == 0
    # 10 dtypes x 3 sizes, a 4th size of float32, the transposed matrices, the receives from
    # any source, the monitored barriers, the pipeline.
    assert [r["checked"] for r in results] == [10 * 3 + 1 + 4] * world, results
    assert len(results[-1]["losses"]) == 4, results
    others = ", ".join(str(r) for r in range(1, world))
    assert results[0]["missed"] == (
        f"Rank{'s' if world > 2 else ''} {others} failed to pass monitoredBarrier in 2000 ms")


@pytest.mark.parametrize("world", [2, 3])
def test_chunked_entries_one_flight_recorder_entry_per_torch_call(daemon, tmp_path, world):
    """Tensors larger than the staging buffer go through it in several commd calls, recorded
    as parts of one entry with the whole collective's sizes, as one call would record it."""
    code, results = torchrun(daemon, tmp_path, "chunked_entries", world)
    assert code == 0
    for r in results:
        n = r["n"]
        seqs = [e[5] for e in r["entries"]]
        assert seqs == list(range(seqs[0], seqs[0] + 7)), r["entries"]
        assert [e[:5] for e in r["entries"]] == [
            ["nccl:all_reduce", [[n]], [[n]], ["Float"], "completed"],
            ["nccl:all_gather", [[n]], [[world * n]], ["Float"], "completed"],
            ["nccl:reduce_scatter", [[world * n]], [[n]], ["Float"], "completed"],
            ["nccl:broadcast", [[n]], [[n]], ["BFloat16"], "completed"],
            ["nccl:all_to_all", [[world * n]], [[world * n]], ["Float"], "completed"],
            # PRODUCT: the SDK's all-reduce, in chunks, as any other op.
            ["nccl:all_reduce", [[n]], [[n]], ["Float"], "completed"],
            ["nccl:all_reduce", [[1001]], [[1001]], ["Float"], "completed"],
        ], r["entries"]


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_with_commd_reaches_the_same_parameters_as_gloo(daemon, tmp_path, world):
    code, results = torchrun(daemon, tmp_path, "ddp", world, "20")
    assert code == 0
    assert results[0]["parameters"] == 16 * 32 + 32 + 32 * 4 + 4
    # Printed, for docs/torch.md: how far apart the two runs' parameters actually ended.
    print(f"DDP commd vs gloo, {world} ranks, 20 steps: max |difference| "
          f"{results[0]['max_abs_difference']:.3g}, largest |parameter| "
          f"{results[0]['largest_parameter']:.3g}, the smallest step's largest change "
          f"{results[0]['smallest_step']:.3g}")


def test_fsdp2_and_functional_collectives_match_gloo(daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "fsdp", 2)
    assert code == 0
    assert results[0]["parameters"] == 16 * 32 + 32 + 32 * 4 + 4


def test_a_hung_rank_is_diagnosed_and_the_others_raise(daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "hang", 2,
                             env={"COMMD_TEST_PG_TIMEOUT": "3"})
    assert code == 0
    assert results[0]["raised"] == "DistBackendError", results
    assert results[0]["cause"] == "AbortedError", results
    # The watchdog's diagnosis names the rank that never entered, on every rank.
    assert "rank(s) [1] never entered" in results[0]["message"], results
    assert "rank(s) [1] never entered" in results[1]["abort_reason"], results


def test_nan_policy_fail_raises_on_every_rank(daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "nan", 2)
    assert code == 0
    for r in results:
        assert r["raised"] == "DistBackendError" and r["cause"] == "DataLossError", results
        assert "rank 0" in r["message"], results


def test_a_killed_rank_makes_the_others_raise_naming_it(daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "death", 3)
    assert code != 0  # torchrun reports the killed rank
    for r in results[:2]:
        assert r is not None and r["raised"] == "DistBackendError", results
        assert "rank 2" in r["message"], results
    assert results[2] is None
    killed_at = json.loads((tmp_path / "death" / "killed.json").read_text())["killed_at"]
    assert max(r["raised_at"] for r in results[:2]) - killed_at < 30, results  # timeout: 60 s


def test_bad_arguments_raise_clear_errors(daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "bad_arguments", 2)
    assert code == 0
    local = results[0]["local"]
    assert "uint16" in local["uint16"] and "bool" in local["uint16"]
    assert "summing to the output's" in local["bad splits"]
    assert "gather list has" in local["short gather list"]
    assert "tag -1 is out of range (allowed: 0..2147483647)" in local["negative tag"]
    for r in results:
        assert r["mismatch"]["raised"] == "DistBackendError", results


@pytest.mark.parametrize("world", [2, 3])
def test_fused_matmul_against_the_unfused_reference(daemon, tmp_path, world):
    code, results = torchrun(daemon, tmp_path, "fused_matmul", world)
    assert code == 0
    for r in results:
        assert r["checked"] == 26, r  # 3 dtypes x 2 dims x 4 checks, in place, the MLP
        assert "not a multiple of the world size" in r["refused"], r


@pytest.mark.parametrize("world", [2, 3])
def test_zero_copy_runs_in_the_cpp_backend_as_in_the_python_one(daemon, tmp_path, world):
    """The same scenario with the C++ backend (COMMD_TORCH_CPP=1: the build has it) and with
    the Python one alone: the same results, entries and error; only the C++ one's counters
    show the zero-copy calls it ran itself. torch's own FlightRecorderHook (torch 2.15 on)
    is left off commd's groups, which record themselves, unless COMMD_TORCH_FR_HOOK=1 (the
    Python run): commd's entries are the same either way."""
    runs = {}
    for cpp in ("1", "0"):
        code, results = torchrun(daemon, tmp_path / f"cpp{cpp}", "zero_copy", world,
                                 env={"COMMD_TORCH_CPP": cpp,
                                      "COMMD_TORCH_FR_HOOK": "1" if cpp == "0" else "0"})
        assert code == 0
        runs[cpp] = results
    import torch.distributed.distributed_c10d as c10d

    has_hook = hasattr(c10d, "_FR_SELF_RECORDING_BACKENDS")  # torch 2.15 on
    for r in runs["1"]:
        assert r["torch_fr_hook"] is (False if has_hook else None), r
    for r in runs["0"]:
        assert r["torch_fr_hook"] is (True if has_hook else None), r
    for r in runs["1"]:
        assert r["cpp"] is True, r
        assert r["zero_copy_calls"] == r["taken"], r
        assert r["after_mismatch"] == 1, r  # the mismatched call went through the C++ path
    for r in runs["0"]:
        assert r["cpp"] is False, r
    for c, p in zip(runs["1"], runs["0"]):
        assert c["checked"] == p["checked"] > 70, (c, p)
        # The same flight-recorder entries (op, shapes, process group, state), one per call.
        assert len(c["entries"]) >= c["checked"], c
        assert c["entries"] == p["entries"], (c, p)
        # The error: DistBackendError, the commd error chained, alike in both.
        assert c["mismatch"]["raised"] == "DistBackendError", c
        assert c["mismatch"]["cause"] == "InvalidArgumentError", c
        assert "ranks disagree on the call" in c["mismatch"]["message"], c
        assert c["mismatch"] == p["mismatch"], (c, p)  # message included


@pytest.mark.parametrize("cpp", ["1", "0"])
def test_work_of_an_async_op_behaves_as_torch_documents(daemon, tmp_path, cpp):
    """The same body with the C++ backend and with the Python one alone (worker.work)."""
    code, results = torchrun(daemon, tmp_path, "work", 2, env={"COMMD_TORCH_CPP": cpp})
    assert code == 0
    for r in results:
        assert r["cpp"] is (cpp == "1"), r
        assert r["checked"] == 4, r


@pytest.mark.parametrize("cpp", ["1", "0"])
def test_ctrl_c_in_a_zero_copy_all_reduce_aborts_the_group(daemon, tmp_path, cpp):
    """SIGINT to a rank blocked in a zero-copy all-reduce (its peer never comes): with either
    backend it raises KeyboardInterrupt at once and aborts the group, so the peer raises
    instead of waiting out the timeout. Timings only bound a hang."""
    out = tmp_path / "interrupt"
    out.mkdir()
    env = dict(os.environ, COMMD_RUNTIME_DIR=daemon.runtime_dir, OMP_NUM_THREADS="1",
               COMMD_TORCH_CPP=cpp)
    env.pop("COMMD_JOB_ID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--monitor-interval=5", WORKER, "interrupt", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    blocked = out / "blocked"
    deadline = time.monotonic() + 300
    while not blocked.exists() or not blocked.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    time.sleep(0.5)  # into the all-reduce
    os.kill(int(blocked.read_text()), signal.SIGINT)
    output = proc.communicate(timeout=300)[0]
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in range(2))
    print(r0, r1)
    assert proc.returncode == 0, output[-5000:]
    assert r0["raised"] == "KeyboardInterrupt", r0
    assert r0["cpp"] is (cpp == "1"), r0
    assert r0["zero_copy_calls"] == (1 if cpp == "1" else 0), r0
    assert r0["seconds"] < 30, r0  # the group's timeout is 60 s
    assert r0["abort_requested"], r0
    assert r0["abort_reason"].endswith("got KeyboardInterrupt in all_reduce"), r0
    assert r1["raised"] == "DistBackendError" and r1["cause"] == "AbortedError", r1


def test_internal_handles_refuse_what_is_not_theirs():
    """The internal surface between commd._commd and commd._c10d (capsules): anything else
    passed where a capsule of the other kind is expected raises, and nothing is registered."""
    c10d = pytest.importorskip("commd._c10d")
    import torch.distributed as dist
    from commd import _commd

    registry = _commd.SymmetricRegistry()
    for bad in (None, 3, b"x" * 64, object()):
        with pytest.raises((TypeError, ValueError)):
            registry.add(bad)
    assert len(registry) == 0
    assert registry.find(4096, 8) is None
    import ctypes
    forged = ctypes.pythonapi.PyCapsule_New
    forged.restype = ctypes.py_object
    forged.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    wrong_name = forged(ctypes.c_void_p(id(registry)), b"commd._commd.GroupHandle", None)
    with pytest.raises(TypeError, match="expected a commd.SymmetricBuffer"):
        registry.add(wrong_name)  # a group's capsule is no buffer
    assert len(registry) == 0
    store = dist.HashStore()
    with pytest.raises(ValueError, match="expected a commd._commd.SymmetricRegistryHandle"):
        c10d.Backend(store, wrong_name, wrong_name)  # a group's capsule is no registry's
    # The Backend takes only a ProcessGroupCommd and a group capsule.
    with pytest.raises(TypeError, match="must be a commd.torch.ProcessGroupCommd"):
        c10d.Backend(store, wrong_name, registry._internal_handle())
