"""PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test)
run against one backend, as PyTorch's test_distributed_spawn.py runs it: BACKEND names it
("gloo" or "commd"), WORLD_SIZE the ranks, and each test spawns its ranks. Importing
commd.torch registers "commd"; its ranks find the daemon through COMMD_RUNTIME_DIR.

    BACKEND=commd WORLD_SIZE=2 COMMD_RUNTIME_DIR=... python -m pytest pytorch_suite.py

scripts/torch-suite runs it for gloo and commd side by side and prints both counts."""

import os
import sys

import commd.torch  # noqa: F401  registers the "commd" backend
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    if "BACKEND" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit("set BACKEND (gloo or commd) and WORLD_SIZE")
    run_tests()
