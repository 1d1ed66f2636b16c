"""Fixtures of the binding's tests: the real commd binary on a temporary runtime dir (as
tests/integration/daemon_process.h starts it) and real rank processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # ranks.py, for spawned rank processes


class Daemon:
    def __init__(self, tmp: str, config: str | None = None) -> None:
        """A daemon on `tmp`, with `config` (textproto of commd.v1.DaemonConfig) when given."""
        self.runtime_dir = os.path.join(tmp, "run")
        self.dump_dir = os.path.join(tmp, "dumps")
        self.log_path = os.path.join(tmp, "commd.log")
        binary = os.environ.get("COMMD_BINARY")
        if not binary:
            pytest.fail("COMMD_BINARY is not set (run these tests through ctest)")
        args = [binary, "--runtime-dir", self.runtime_dir, "--metrics-address", "127.0.0.1:0",
                "--dump-dir", self.dump_dir]
        if config is not None:
            path = os.path.join(tmp, "commd.textproto")
            with open(path, "w") as f:
                f.write(config)
            args += ["--config", path]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while b"commd ready" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"commd did not get ready: {self.log().decode(errors='replace')}")
            time.sleep(0.05)

    def log(self) -> bytes:
        with open(self.log_path, "rb") as f:
            return f.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(str(tmp_path_factory.mktemp("commd")))
    yield d
    d.stop()


@pytest.fixture
def job() -> str:
    """A job id of its own per test: groups and keys of one test never meet another's."""
    return "job-" + uuid.uuid4().hex[:12]


@pytest.fixture
def client(daemon, job):
    import commd

    return commd.Client.connect(runtime_dir=daemon.runtime_dir, job_id=job)
