"""Process groups of another commd job (issue 15, section 5: "a group of another job"):
ranks of one torch job in different commd jobs, and a second torch job under the job id of
one that is running, fail at init_process_group with an error naming the jobs instead of
waiting out the group's timeout (300 s here: a hang fails the message checks)."""

from __future__ import annotations

import os
import threading
import time

import pytest

pytest.importorskip("torch")

from test_backend import torchrun  # noqa: E402

JOB_WORKER = os.path.join(os.path.dirname(__file__), "job_worker.py")


def test_a_rank_in_another_commd_job_fails_at_init_naming_both_jobs(daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "other_job", 2, worker=JOB_WORKER,
                             env={"OTHER_JOB_RANK": "1"})
    assert code == 0
    for rank, r in enumerate(results):
        assert r is not None and r["raised"] == "RuntimeError", results
        assert "'other-job'" in r["message"] and "'torch-" in r["message"], results
        assert "every rank of a torch job must be in one commd job" in r["message"], results
    assert results[0]["message"].startswith("commd: rank 0 is in commd job 'torch-"), results
    assert results[1]["message"].startswith("commd: rank 1 is in commd job 'other-job' but "
                                            "rank 0 is in 'torch-"), results


def test_a_second_job_under_a_running_jobs_id_is_refused_naming_the_job(daemon, tmp_path):
    shared = {"TEST_COMMD_JOB_ID": "shared-job"}
    first: dict = {}

    def run_first():
        first["result"] = torchrun(daemon, tmp_path, "hold", 2, worker=JOB_WORKER, env=shared)

    holder = threading.Thread(target=run_first)
    holder.start()
    try:
        deadline = time.monotonic() + 300  # a bound, not a timing
        while not all((tmp_path / "hold" / f"rank{r}.json").exists() for r in range(2)):
            assert holder.is_alive() and time.monotonic() < deadline, first
            time.sleep(0.1)
        code, results = torchrun(daemon, tmp_path, "other_job", 2, worker=JOB_WORKER,
                                 env=shared)
    finally:
        (tmp_path / "hold").mkdir(exist_ok=True)
        (tmp_path / "hold" / "release").touch()
        holder.join(600)
    assert code == 0
    assert first["result"][0] == 0  # the running job was not disturbed
    for rank, r in enumerate(results):
        assert r is not None and r["raised"] == "DistBackendError", results
        assert (f"commd: rank {rank} of 2 could not join group '0' of commd job 'shared-job': "
                in r["message"]), results
        assert "group 0 has already formed (world size 2)" in r["message"], results
