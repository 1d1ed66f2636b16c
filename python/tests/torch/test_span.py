"""The torch.distributed backend "commd" on a job whose ranks span nodes: a real etcd on
loopback, two real daemons as two nodes of its cluster (each its own runtime dir), and one
torchrun per node (`--nnodes 2 --node-rank 0|1`, static rendezvous), each rank reaching its
node's daemon through COMMD_RUNTIME_DIR and the other node through gloo on `lo`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from conftest import Daemon  # noqa: E402

ETCD = "/usr/bin/etcd"
WORKER = os.path.join(os.path.dirname(__file__), "span_worker.py")
NODES = ("node-a", "node-b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """One etcd member on loopback, on free ports and a data dir of its own."""

    def __init__(self, tmp: str) -> None:
        self.endpoint = f"127.0.0.1:{free_port()}"
        peer = f"http://127.0.0.1:{free_port()}"
        self.log_path = os.path.join(tmp, "etcd.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", os.path.join(tmp, "data"),
             "--listen-client-urls", f"http://{self.endpoint}",
             "--advertise-client-urls", f"http://{self.endpoint}",
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"t={peer}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while b"ready to serve client requests" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"etcd did not start: {self.log().decode(errors='replace')}")
            time.sleep(0.1)

    def log(self) -> bytes:
        with open(self.log_path, "rb") as f:
            return f.read()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._log.close()


def cluster_config(etcd: Etcd, node: str) -> str:
    return (f'cluster {{\n  etcd_endpoints: "{etcd.endpoint}"\n  node_name: "{node}"\n'
            '  prefix: "/commd-torch"\n}\n')


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """Two daemons, nodes node-a and node-b of one etcd cluster, connected."""
    if not os.access(ETCD, os.X_OK):
        pytest.skip(f"{ETCD} is missing: install Debian's etcd-server (scripts/install-deps)")
    import commd

    etcd = Etcd(str(tmp_path_factory.mktemp("etcd")))
    daemons = [Daemon(str(tmp_path_factory.mktemp(n)), cluster_config(etcd, n)) for n in NODES]
    try:
        deadline = time.monotonic() + 30
        for d in daemons:
            client = commd.Client.connect(runtime_dir=d.runtime_dir)
            while (client.status()["cluster"] or {}).get("state") != "connected":
                assert time.monotonic() < deadline, d.log().decode(errors="replace")
                time.sleep(0.1)
        yield daemons
    finally:
        for d in daemons:
            d.stop()
        etcd.stop()


def torchrun_nodes(daemons, tmp_path, scenario: str, nproc: int, *args: str,
                   until: list[int] | None = None,
                   timeout: float = 600) -> tuple[list[int | None], list]:
    """One torchrun per daemon (node rank i on daemons[i]), `nproc` ranks each; returns each
    torchrun's exit code and each global rank's JSON (None for a rank that wrote none). With
    `until`, the torchruns are ended (exit code None) once those ranks wrote theirs: a
    torchrun whose peer node failed otherwise waits out its agents' exit barrier (300 s)."""
    out = tmp_path / scenario
    out.mkdir()
    port = free_port()
    procs, logs = [], []
    for node_rank, d in enumerate(daemons):
        env = dict(os.environ, COMMD_RUNTIME_DIR=d.runtime_dir, COMMD_GLOO_IFACE="lo",
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                   COMMD_TORCH_CHUNK_BYTES=str(1 << 20))
        env.pop("COMMD_JOB_ID", None)  # rank 0 makes one and hands it to every node
        logs.append(open(tmp_path / f"{scenario}-{NODES[node_rank]}.log", "w+"))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(daemons)}",
             f"--node-rank={node_rank}", f"--nproc-per-node={nproc}",
             "--master-addr=127.0.0.1", f"--master-port={port}", "--monitor-interval=1",
             WORKER, scenario, str(out), *args],
            env=env, stdout=logs[-1], stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if until is not None and all((out / f"rank{r}.json").exists() for r in until):
                break
            if time.monotonic() > deadline:
                for log in logs:
                    log.seek(0)
                    print(log.read()[-20000:])
                for d in daemons:
                    print(d.log().decode(errors="replace")[-20000:])
                pytest.fail(f"torchrun {scenario} took over {timeout} s; ranks that wrote: "
                            f"{sorted(p.name for p in out.iterdir())}")
            time.sleep(0.2)
    finally:
        for p in procs:  # each torchrun with its workers (a session of its own)
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    codes = [None if until is not None else p.returncode for p in procs]
    for node_rank, log in enumerate(logs):
        if until is None and procs[node_rank].returncode != 0:
            log.seek(0)
            print(f"--- torchrun of {NODES[node_rank]}:\n{log.read()[-20000:]}")
        log.close()
    results = []
    for r in range(nproc * len(daemons)):
        path = out / f"rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
    return codes, results


def test_every_op_across_two_nodes(nodes, tmp_path):
    codes, results = torchrun_nodes(nodes, tmp_path, "spanning", 2)
    assert codes == [0, 0], [d.log().decode(errors="replace")[-5000:] for d in nodes]
    for r, res in enumerate(results):
        assert res is not None and "checked" in res, (r, res)
        # The default group: a commd group spanning both nodes, node-local ranks by world rank.
        assert res["default"] == {"nodes": 2, "local": [r % 2, 2], "global": [r, 4],
                                  "layout": [["node-a", [0, 1]], ["node-b", [2, 3]]]}, res
        refused = res["refused"]
        assert "name the sender" in refused["recv from any source"], refused
        # Not refused any more: it reaches the CUDA group's making, which needs a GPU (or, on
        # a machine with one, runs).
        assert not refused["cuda"].startswith("NotImplementedError"), refused
        assert "spans" not in refused["cuda"], refused
        if not torch.cuda.is_available():
            assert refused["cuda"].startswith(("AssertionError", "RuntimeError")), refused
        assert "spans 2 nodes" in refused["fused matmul"], refused
        assert "fused_matmul_reduce_scatter" in refused["fused matmul"], refused
    # new_group([1, 2, 3]): one rank on node-a, two on node-b.
    for r in (1, 2, 3):
        assert results[r]["uneven"] == {
            "nodes": 2, "local": [[0, 1], [0, 2], [1, 2]][r - 1], "global": [r - 1, 3],
            "layout": [["node-a", [0]], ["node-b", [1, 2]]]}, results[r]
    for r in (0, 2):
        assert results[r]["one_each"] == {"nodes": 2, "local": [0, 1], "global": [r // 2, 2],
                                          "layout": [["node-a", [0]], ["node-b", [1]]]}
    # new_group([2, 3]): both on node-b, a node-local group as before.
    for r in (2, 3):
        assert results[r]["local"] == {"nodes": 1, "local": [r - 2, 2], "global": [r, 2],
                                       "layout": []}, results[r]
    # Checks per rank: the default group's, then each subgroup the rank is in (span_worker).
    memberships = [1, 1, 3, 2]
    assert [res["checked"] for res in results] == [325 + 92 * m for m in memberships]


def test_ddp_across_two_nodes_reaches_the_same_parameters_as_gloo(nodes, tmp_path):
    codes, results = torchrun_nodes(nodes, tmp_path, "ddp", 2, "10")
    assert codes == [0, 0]
    assert [r["parameters"] for r in results] == [16 * 32 + 32 + 32 * 4 + 4] * 4, results


def test_a_killed_rank_on_one_node_makes_every_rank_of_both_nodes_raise(nodes, tmp_path):
    """Rank 3 (node-b) is SIGKILLed in a loop of all-reduces: its node-mate's call raises the
    daemon's abort naming the death; node-a's ranks' calls raise too (the exchange between the
    nodes broken, or the abort announced across nodes, whichever reaches them first); all
    within seconds of the death, not at the group's timeout (60 s)."""
    _, results = torchrun_nodes(nodes, tmp_path, "death", 2, until=[0, 1, 2], timeout=300)
    killed_at = json.loads((tmp_path / "death" / "killed.json").read_text())["killed_at"]
    assert results[3] is None, results
    for r in (0, 1, 2):
        assert results[r] is not None and results[r]["raised"] == "DistBackendError", results
    assert results[2]["cause"] == "AbortedError", results
    assert "killed by SIGKILL" in results[2]["message"], results
    for r in (0, 1):
        assert results[r]["cause"] in ("UnavailableError", "AbortedError"), results
        assert "group 0" in results[r]["message"], results
    # Far below the timeout, with room for a loaded machine (the abort itself takes
    # milliseconds across nodes: docs/cluster.md).
    assert max(results[r]["raised_at"] for r in (0, 1, 2)) - killed_at < 30, results


def test_ranks_on_two_daemons_without_a_cluster_fail_at_init(tmp_path_factory, tmp_path):
    """Two daemons that are no cluster: every rank's init_process_group fails at once naming
    what is missing, instead of waiting for the group's timeout."""
    daemons = [Daemon(str(tmp_path_factory.mktemp(n))) for n in NODES]
    try:
        start = time.monotonic()
        codes, results = torchrun_nodes(daemons, tmp_path, "no_cluster", 1)
        elapsed = time.monotonic() - start
    finally:
        for d in daemons:
            d.stop()
    assert codes == [0, 0]
    for res in results:
        assert res["raised"] == "DistBackendError", results
        assert res["cause"] == "FailedPreconditionError", results
        assert "spanning 2 nodes" in res["message"], results
        assert "needs a cluster" in res["message"], results
    assert elapsed < 50, elapsed  # far below the group's 60 s timeout
