"""commd.torch's session with the daemon: the backend's options, the process's one commd
session, the node it is attached to, where a process group's ranks are, and the description
torch gives a group. A leaf of commd.torch (it imports commd, not commd.torch)."""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys

import torch.distributed as dist

from commd import MAX_GROUP_DESCRIPTION_BYTES, Client

BACKEND_NAME = "commd"


@dataclasses.dataclass
class Options:
    """The backend's options: ``init_process_group("commd", pg_options=commd.torch.Options(...))``
    or ``dist.new_group(..., pg_options=...)``. Unset fields come from the environment
    (``COMMD_TORCH_CHUNK_BYTES``, ``COMMD_TORCH_WATCHDOG_POLICY``, ``COMMD_TORCH_NAN_CHECK``,
    ``COMMD_TORCH_NAN_POLICY``), then from the daemon's config."""

    # Bytes of each rank's staging buffer: a collective on a tensor that does not live in a
    # symmetric buffer is copied through it in pieces of at most this size (one
    # flight-recorder entry for all the pieces of a collective). 1 MiB to 1 GiB.
    chunk_bytes: int | None = None
    watchdog_policy: str | None = None  # "report" | "notify" | "terminate"
    nan_check: str | None = None  # "off" | "on" | "sampled"
    # For "sampled": commd.MIN_NAN_SAMPLE_PERIOD to MAX_NAN_SAMPLE_PERIOD; 0: the daemon's.
    nan_sample_period: int = 0
    nan_policy: str | None = None  # "report" | "fail"

    DEFAULT_CHUNK_BYTES = 16 << 20
    MIN_CHUNK_BYTES = 1 << 20
    MAX_CHUNK_BYTES = 1 << 30

    def resolved(self) -> "Options":
        env = os.environ.get
        chunk = self.chunk_bytes
        if chunk is None:
            chunk = int(env("COMMD_TORCH_CHUNK_BYTES", self.DEFAULT_CHUNK_BYTES))
        if not self.MIN_CHUNK_BYTES <= chunk <= self.MAX_CHUNK_BYTES:
            raise ValueError(
                f"commd.torch: chunk_bytes {chunk} is out of range; allowed "
                f"{self.MIN_CHUNK_BYTES} to {self.MAX_CHUNK_BYTES} (Options.chunk_bytes, "
                "COMMD_TORCH_CHUNK_BYTES)")
        return dataclasses.replace(
            self,
            chunk_bytes=chunk - chunk % 64,
            watchdog_policy=self.watchdog_policy or env("COMMD_TORCH_WATCHDOG_POLICY"),
            nan_check=self.nan_check or env("COMMD_TORCH_NAN_CHECK"),
            nan_policy=self.nan_policy or env("COMMD_TORCH_NAN_POLICY"),
        )


# One session per process: every process group of the job is a group of this session.
_client: Client | None = None


def _connect(store: dist.Store, group_rank: int, world_size: int) -> Client:
    """The process's session, opened by the first (default) process group. Without
    COMMD_JOB_ID the job id comes from rank 0 through torch's store, so two torchrun jobs on
    one node are two commd jobs. Every rank publishes the job it is in and checks its
    peers': a rank in another commd job (a COMMD_JOB_ID of its own) would otherwise wait in
    a rendezvous its peers never join until the group's timeout."""
    global _client
    if _client is None:
        job = os.environ.get("COMMD_JOB_ID")
        if group_rank == 0:
            store.set("commd/job_id", job or "torch-" + secrets.token_hex(6))
        if not job:
            job = store.get("commd/job_id").decode()
        store.set(f"commd/job_of_rank/{group_rank}", job)
        for r in range(world_size):
            theirs = store.get(f"commd/job_of_rank/{r}").decode()
            if theirs != job:
                raise RuntimeError(
                    f"commd: rank {group_rank} is in commd job {job!r} but rank {r} is in "
                    f"{theirs!r}; every rank of a torch job must be in one commd job (set the "
                    "same COMMD_JOB_ID on every rank, or none: the backend then makes one)")
        _client = Client.connect(job_id=job)
    return _client


# The commd node this process is attached to (see _node_of).
_node: str | None = None


def _node_of(client: Client) -> str:
    """The commd node this process's daemon is: its cluster node name (unique within a
    cluster), else the daemon itself (host, runtime dir, pid), so that ranks attached to two
    daemons without a cluster are two nodes and their group fails to join naming the missing
    cluster instead of running as two unrelated groups."""
    global _node
    if _node is None:
        status = client.status()
        cluster = status.get("cluster")
        if cluster and cluster.get("node_name"):
            _node = "node " + cluster["node_name"]
        else:
            _node = (f"daemon {status['hostname']}:{status['runtime_dir']} (pid "
                     f"{status['pid']}, no cluster)")
    return _node


@dataclasses.dataclass(frozen=True)
class _Placement:
    """Where a process group's ranks are: this rank's place among the group's ranks on its
    node (sorted by group rank) and how many nodes hold the group's ranks."""

    node: str
    local_rank: int
    local_size: int
    nodes: int


def _placement(store: dist.Store, rank: int, size: int, node: str) -> _Placement:
    """Every rank of the group publishes its node through the group's store and reads its
    peers': one round of the store per group, as torch's own backends exchange addresses."""
    store.set(f"commd/node_of_rank/{rank}", node)
    nodes = [v.decode() for v in
             store.multi_get([f"commd/node_of_rank/{r}" for r in range(size)])]
    mine = [r for r in range(size) if nodes[r] == node]
    return _Placement(node=node, local_rank=mine.index(rank), local_size=len(mine),
                      nodes=len(set(nodes)))



def _group_desc_being_made() -> str:
    """The description torch gives the process group it is creating (init_process_group's
    "default_pg", new_group's group_desc, else "undefined"). torch sets it on the group only
    after the group's backends exist and passes a backend's constructor no copy, so it is
    read from the torch function that is calling the constructor; a torch that calls it
    otherwise gives "undefined", as torch describes a group without one. Bounded to what the
    daemon takes: printable ASCII ('?' for any other character), at most
    MAX_GROUP_DESCRIPTION_BYTES."""
    desc = "undefined"
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name == "_new_process_group_helper"
                and frame.f_globals.get("__name__") == dist.distributed_c10d.__name__):
            found = frame.f_locals.get("group_desc")
            if isinstance(found, str) and found:
                desc = found
            break
        frame = frame.f_back
    return "".join(c if " " <= c <= "~" else "?" for c in desc)[:MAX_GROUP_DESCRIPTION_BYTES]

