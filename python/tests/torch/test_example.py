"""examples/torch_train.py as a user runs it: `torchrun --standalone --nproc-per-node 2
examples/torch_train.py --steps 30` against a real daemon. The job's group forms in the
daemon, the loss the ranks print is finite and falls, and DDP left the parameters identical
on every rank."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples",
                       "torch_train.py")


def test_the_example_trains_on_commd(daemon):
    env = dict(os.environ, COMMD_RUNTIME_DIR=daemon.runtime_dir, OMP_NUM_THREADS="1")
    env.pop("COMMD_JOB_ID", None)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--monitor-interval=5", EXAMPLE, "--steps", "30"],
        env=env, timeout=600, capture_output=True, text=True)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    job = re.search(r"^commd job (torch-[0-9a-f]{12}), group 0$", proc.stdout, re.M)
    assert job, proc.stdout
    # The daemon saw the job's default group form with both ranks.
    assert f"group {job.group(1)}/0 formed: 2 rank(s)" in daemon.log().decode(), job.group(1)
    steps = [(int(s), float(loss)) for s, loss in
             re.findall(r"^step +(\d+)  loss (\S+)  \(2 ranks\)$", proc.stdout, re.M)]
    assert [s for s, _ in steps] == [0, 10, 20, 29], proc.stdout
    losses = [loss for _, loss in steps]
    assert all(math.isfinite(x) for x in losses), losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    n = 64 * 256 + 256 + 256 * 10 + 10
    assert f"parameters identical on all 2 ranks ({n} values)" in proc.stdout, proc.stdout
