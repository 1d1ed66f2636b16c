#!/usr/bin/env python3
"""The all-reduce across nodes (issue #16 section 7) against gloo: NODES daemons acting as
nodes of one real etcd on this machine, RANKS rank processes on each, one group spanning them
all. Each rank process runs, size by size and interleaved in the same run:

  - commd through the host-memory overload (what commd.torch's CPU path calls): each node's
    ranks meet over symmetric memory, the nodes' leaders over gloo (client/src/
    span_collectives.cc);
  - commd on data already in a symmetric buffer (commd.torch.empty's zero-copy path: no
    staging copies);
  - torch.distributed's gloo backend over the same NODES x RANKS processes (a flat ring over
    TCP loopback between every rank), the baseline.

float32 sum, 8 B to 64 MiB. Each figure is the time per call of ITERS calls back to back
after a barrier, the slowest rank's, best of ROUNDS rounds. Prints one row per size with
commd's two times and gloo's, and each of commd's as a fraction of gloo's.

--phases measures instead the node-local phase of the zero-copy spanning all-reduce against
commd's single-node all-reduce over the same data: the ranks run with COMMD_SPAN_PROFILE=1
(client/src/span_profile.h: per size, each rank's time per call and the part of it
spent between nodes, the wait for the other nodes included), and each node's ranks also form
a node-local group. Per size, interleaved round by round: the spanning all-reduce, then the
node-local all-reduce, both in place on a symmetric buffer; each rank's mean per call over
every call (warm-up calls included, as the profile counts them). Prints per size the
spanning call, its part between nodes, the rest (the node-local phase), the node-local
all-reduce, and the node-local phase over the node-local all-reduce; each the slowest
rank's.

Usage: bench/span_allreduce.py BUILD_DIR [--nodes 2] [--ranks 2] [--rounds 3] [--phases]
Needs /usr/bin/etcd (Debian's etcd-server), torch (scripts/torch-venv; run this with that
Python) and the Python binding built in BUILD_DIR. Everything listens on loopback.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_scale  # noqa: E402 (etcd and the daemons as nodes)

RANK = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import torch
    import torch.distributed as dist
    import commd
    run, node_rank, local, per_node, global_rank, world, port, rounds, phases = sys.argv[1:10]
    local, per_node, g, world, rounds = int(local), int(per_node), int(global_rank), int(world), int(rounds)
    phases = phases == "1"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=g,
                            world_size=world)
    client = commd.Client.connect(runtime_dir=run, job_id="bench")
    group = client.join_group("span", local, per_node, global_rank=g, global_world_size=world,
                              timeout=600)
    staging = group.allocate_symmetric(64 << 20)
    symmetric = group.allocate_symmetric(64 << 20)
    data = np.ones((64 << 20) // 4, dtype=np.float32)
    tensor = torch.from_numpy(data)

    def timed(fn, iters):
        fn()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        t = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    if phases:
        node_group = client.join_group("node", local, per_node, timeout=600)
        node_buffer = node_group.allocate_symmetric(64 << 20)
        # Every page of both buffers touched and every lane connected before any size is
        # timed (a size of its own, which the table leaves out).
        warm = (64 << 20) // 4 - 1
        group.all_reduce(symmetric.view("float32", (warm,)), op="sum")
        node_group.all_reduce(node_buffer.view("float32", (warm,)), op="sum")
        for size in (8, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20):
            n = size // 4
            iters = 200 if size <= (64 << 10) else 20 if size <= (4 << 20) else 3
            spanning = symmetric.view("float32", (n,))
            node_local = node_buffer.view("float32", (n,))
            total = 0.0
            for _ in range(rounds):
                timed(lambda: group.all_reduce(spanning, op="sum"), iters)
                node_group.all_reduce(node_local, op="sum")
                start = time.perf_counter()
                for _ in range(iters):
                    node_group.all_reduce(node_local, op="sum")
                total += time.perf_counter() - start
            print(f"LOCAL {size} {total / (rounds * iters) * 1e6:.1f}", flush=True)
        node_group.close()
        group.close()  # prints the profile
        dist.barrier()
        print("DONE", flush=True)
        sys.exit(0)

    for size in (8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20):
        n = size // 4
        iters = 200 if size <= (64 << 10) else 20 if size <= (4 << 20) else 3
        view = data[:n]
        piece = tensor[:n]
        typed = symmetric.view("float32", (n,))
        best = {"commd": float("inf"), "zero": float("inf"), "gloo": float("inf")}
        for _ in range(rounds):
            best["commd"] = min(best["commd"], timed(
                lambda: group.all_reduce(view, count=n, dtype="float32", op="sum",
                                         staging=staging), iters))
            best["zero"] = min(best["zero"], timed(lambda: group.all_reduce(typed, op="sum"),
                                                   iters))
            best["gloo"] = min(best["gloo"], timed(lambda: dist.all_reduce(piece), iters))
        if g == 0:
            print(f"ROW {size} {best['commd'] * 1e6:.1f} {best['zero'] * 1e6:.1f} "
                  f"{best['gloo'] * 1e6:.1f}", flush=True)
    dist.barrier()
    print("DONE", flush=True)
""")


def human(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def report_phases(ranks, args):
    """The --phases table from every rank's LOCAL lines and span profile (see the top)."""
    outputs = [p.communicate(timeout=1800) for p in ranks]
    if any(p.returncode != 0 for p in ranks):
        for _, err in outputs:
            sys.stderr.write(err)
        sys.exit("a rank failed")
    span, local = {}, {}  # size -> [per rank (total, between nodes)], [per rank mean]
    for out, err in outputs:
        for line in out.splitlines():
            if line.startswith("LOCAL"):
                _, size, us = line.split()
                local.setdefault(int(size), []).append(float(us))
        for line in err.splitlines():
            # "commd span profile: group span global rank G: all_reduce B B in place: N calls,
            #  T us per call, A us of it between nodes"
            if line.startswith("commd span profile: group span ") and "in place" in line:
                words = line.replace(",", "").split()
                size = int(words[words.index("all_reduce") + 1])
                total = float(words[words.index("per") - 2])
                across = float(words[words.index("between") - 4])
                span.setdefault(size, []).append((total, across))
    print(f"zero-copy all-reduce float32 sum, {args.nodes} nodes x {args.ranks} ranks, "
          f"{args.rounds} rounds, each rank's mean per call, the slowest rank's")
    print(f"{'size':>8} {'spanning us':>12} {'between':>10} {'node-local':>11} "
          f"{'single-node':>12} {'local/single':>13}")
    for size in sorted(local):
        if size not in span or len(span[size]) != len(ranks):
            sys.exit(f"no profile of every rank for {size} B")
        total = max(t for t, _ in span[size])
        across = max(a for _, a in span[size])
        node_local = max(t - a for t, a in span[size])
        single = max(local[size])
        print(f"{human(size):>8} {total:>12.1f} {across:>10.1f} {node_local:>11.1f} "
              f"{single:>12.1f} {node_local / single:>13.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2, help="rank processes per node")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--phases", action="store_true",
                    help="the node-local phase against the single-node all-reduce")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    root = tempfile.mkdtemp(prefix="commd-span-bench-")
    procs = []
    try:
        etcd_endpoint, etcd = cluster_scale.start_etcd(root)
        procs.append(etcd)
        nodes = [cluster_scale.Node(build, root, i, etcd_endpoint) for i in range(args.nodes)]
        procs += [n.proc for n in nodes]
        cluster_scale.wait_connected(nodes, time.time() + 120)
        env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"), OMP_NUM_THREADS="1",
                   COMMD_GLOO_IFACE="lo", COMMD_SPAN_PROFILE="1" if args.phases else "0")
        port = cluster_scale.free_port()
        world = args.nodes * args.ranks
        ranks = []
        for i, n in enumerate(nodes):
            for r in range(args.ranks):
                ranks.append(subprocess.Popen(
                    [sys.executable, "-c", RANK, n.run, str(i), str(r), str(args.ranks),
                     str(i * args.ranks + r), str(world), str(port), str(args.rounds),
                     "1" if args.phases else "0"],
                    env=env, stdout=subprocess.PIPE, text=True,
                    stderr=subprocess.PIPE if args.phases else None))
        procs += ranks
        if args.phases:
            return report_phases(ranks, args)
        print(f"all-reduce float32 sum, {args.nodes} nodes x {args.ranks} ranks, best of "
              f"{args.rounds} rounds, the slowest rank's time per call")
        print(f"{'size':>8} {'staged us':>10} {'zero-copy':>10} {'gloo us':>10} "
              f"{'staged/gloo':>11} {'zero/gloo':>10}")
        for line in ranks[0].stdout:
            if line.startswith("ROW"):
                _, size, staged, zero, gloo = line.split()
                print(f"{human(int(size)):>8} {staged:>10} {zero:>10} {gloo:>10} "
                      f"{float(staged) / float(gloo):>11.2f} {float(zero) / float(gloo):>10.2f}",
                      flush=True)
            elif line.startswith("DONE"):
                break
        for p in ranks:
            if p.wait(timeout=600) != 0:
                sys.exit("a rank failed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()


if __name__ == "__main__":
    main()
