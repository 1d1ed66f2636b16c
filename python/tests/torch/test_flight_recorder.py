"""A torch job's flight recorder through PyTorch's own analyzer: a job on backend "commd"
whose last rank skips an all-reduce is dumped with `commctl dump`, exported with
`commctl fr export --format torch`, and read by torchfrtrace
(torch.distributed.flight_recorder.fr_trace), which must load every rank's file, see the
process groups with the names and descriptions torch gave them, and name the rank missing
from the skipped collective."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from test_backend import torchrun  # noqa: E402

JOB_WORKER = os.path.join(os.path.dirname(__file__), "job_worker.py")
PREFIX = "nccl_trace_rank_"


def frtrace(trace_dir: pathlib.Path, db: pathlib.Path) -> str:
    """torchfrtrace's report on one group's files (it must succeed); its database in `db`."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(trace_dir),
         "--prefix", PREFIX, "-o", str(db)],
        capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    print(f"== torchfrtrace {trace_dir.name}:\n{out}")
    assert proc.returncode == 0, out
    return out


def test_torchfrtrace_reads_a_torch_jobs_export_and_names_the_rank_that_skipped(
        daemon, tmp_path):
    code, results = torchrun(daemon, tmp_path, "flight_recorder", 2, worker=JOB_WORKER,
                             env={"COMMD_TEST_PG_TIMEOUT": "3",
                                  "COMMCTL": os.environ["COMMCTL"]})
    assert code == 0
    waiting, skipper = results
    assert waiting["raised"] == "DistBackendError", results
    assert "rank(s) [1] never entered" in skipper["abort_reason"], results
    tp = skipper["tp_name"]
    # commctl groups' view: the descriptions torch gave its groups.
    assert skipper["groups"] == {"0": "default_pg", tp: "tp"}, skipper
    assert skipper["dump_code"] == 0, skipper["dump"]
    files = [line.strip() for line in skipper["dump"].splitlines() if line.endswith(".json")]
    dump_dir = pathlib.Path(files[0]).parents[1]
    assert sorted(str(pathlib.Path(f).relative_to(dump_dir)) for f in files) == sorted(
        [f"0/rank{r}.json" for r in range(2)] + [f"{tp}/rank{r}.json" for r in range(2)])
    with open(dump_dir / "0" / "rank0.json") as f:
        pg_config = json.load(f)["pg_config"]
    assert [(k, v["name"], v["desc"]) for k, v in pg_config.items()] == [
        ("0", "0", "default_pg")], pg_config

    export = tmp_path / "fr"
    subprocess.run([os.environ["COMMCTL"], "fr", "export", "--in", str(dump_dir), "--out",
                    str(export), "--format", "torch"], check=True, timeout=120)
    assert sorted(p.name for p in (export / "0").iterdir()) == [f"{PREFIX}0", f"{PREFIX}1"]

    # The default group: every rank's file parsed, the skipped all-reduce reported with the
    # rank that never called it.
    report = frtrace(export / "0", tmp_path / "db0")
    assert "group info: 0:default_pg" in report, report  # torch's name:desc of the group
    assert "collective: nccl:all_reduce" in report and "missing ranks: {1}" in report, report
    with open(tmp_path / "db0", "rb") as f:
        _, db = pickle.load(f)
    # The analyzer's group id is its hash of the group's name and ranks.
    assert [(g.desc, g.size) for g in db.groups] == [("default_pg", 2)], db.groups
    guid = db.groups[0].id
    assert sorted((m.group_id, m.global_rank) for m in db.memberships) == [(guid, 0), (guid, 1)]
    assert {c.group_id for c in db.collectives} == {"0"}  # by the group's name
    assert {c.pg_desc for c in db.collectives} == {"0:default_pg"}  # as it prints: name:desc
    assert [(c.collective_name, c.collective_state) for c in db.collectives] == [
        ("nccl:all_reduce", "completed")] * 3 + [("nccl:broadcast", "completed"),
                                                 ("nccl:all_reduce", "started")]

    # The subgroup the job described as "tp": all collectives match, nothing missing.
    report = frtrace(export / tp, tmp_path / "db1")
    assert "missing ranks" not in report and "MISMATCH" not in report, report
    with open(tmp_path / "db1", "rb") as f:
        _, db = pickle.load(f)
    assert [(g.desc, g.size) for g in db.groups] == [("tp", 2)], db.groups
    assert {c.pg_desc for c in db.collectives} == {f"{tp}:tp"}
    assert [(c.collective_name, c.collective_state) for c in db.collectives] == [
        ("nccl:all_reduce", "completed")] * 3 + [("nccl:all_gather", "completed")]
