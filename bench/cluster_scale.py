#!/usr/bin/env python3
"""The cluster at scale on one machine (issue #16 section 7): N daemons acting as N nodes
against one real etcd, each with R rank processes of one job, and what that costs etcd.

Measures, in one run:
  - etcd's writes per second with every node at rest (ranks joined, no collectives), and
    under load (every rank in a loop of barriers): puts, deletes and txns from etcd's own
    metrics, and the raft proposals they cost;
  - a job dump asked on node 0 (commctl dump --job): the time until every node's files of
    that dump id are written (the announcement's watch fan-out to N-1 nodes);
  - a hang found by node 0's watchdog (rank 1 of a group there never enters a barrier): the
    time from the diagnosis (detected_unix_ms in the dump) to every node's file written;
  - the history etcd keeps for those writes until a compaction (its database in use, per
    second and per write), and the size of one group's view (key and value).

Usage: bench/cluster_scale.py BUILD_DIR [--nodes 32] [--ranks 1] [--seconds 10] [--dumps 3]
Needs /usr/bin/etcd (Debian's etcd-server) and the Python binding built in BUILD_DIR.
Everything listens on loopback and is stopped at the end.
"""
import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

ETCD = "/usr/bin/etcd"

RANK = textwrap.dedent("""
    import os, sys, time
    import commd
    runtime, node, rank, world, global_rank, group, mode = sys.argv[1:8]
    client = commd.Client.connect(runtime_dir=runtime, job_id="scale")
    g = client.join_group(group, int(rank), int(world), global_rank=int(global_rank),
                          timeout=float(os.environ.get("SCALE_TIMEOUT", "600")),
                          watchdog_policy="report")
    g.barrier()
    print("JOINED", flush=True)
    if mode == "sleep":
        time.sleep(3600)
    start = None
    while True:
        if mode == "load" and os.path.exists(sys.argv[8]):
            g.barrier()
        elif mode == "enter-once":
            print("ENTERING", flush=True)
            try:
                g.barrier()
            except commd.Error as e:
                print("ENDED", e.code, flush=True)
            time.sleep(3600)
        else:
            time.sleep(0.05)
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url, names):
    """The sum of each named series (all label sets) at a Prometheus endpoint."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {n: 0.0 for n in names}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


class Node:
    def __init__(self, build, root, index, etcd_endpoint):
        self.name = f"node-{index:03d}"
        self.dir = os.path.join(root, self.name)
        self.run = os.path.join(self.dir, "run")
        self.dumps = os.path.join(self.dir, "dumps")
        os.makedirs(self.run)
        config = os.path.join(self.dir, "commd.textproto")
        with open(config, "w") as f:
            f.write(f'cluster {{ etcd_endpoints: "{etcd_endpoint}" node_name: "{self.name}" '
                    f'prefix: "/scale" }}\nwatchdog {{ poll_interval_ms: 100 }}\n')
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = subprocess.Popen(
            [os.path.join(build, "daemon/commd"), "--config", config, "--runtime-dir", self.run,
             "--metrics-address", "127.0.0.1:0", "--dump-dir", self.dumps],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.metrics = None

    def wait_ready(self, deadline):
        while time.time() < deadline:
            self.log.seek(0)
            text = self.log.read()
            m = re.search(r"serving http://([0-9.:]+)/metrics", text)
            if m and "commd ready" in text:
                self.metrics = f"http://{m.group(1)}/metrics"
                return
            if self.proc.poll() is not None:
                sys.exit(f"{self.name} exited:\n{text}")
            time.sleep(0.05)
        sys.exit(f"{self.name} not ready")

    def value(self, name):
        return scrape(self.metrics, [name])[name]


def start_etcd(root):
    """A one-member etcd on loopback with its data under `root`: (endpoint, process), once it
    answers."""
    if not os.access(ETCD, os.X_OK):
        sys.exit(f"{ETCD} is missing: install Debian's etcd-server")
    cport, pport = free_port(), free_port()
    endpoint = f"127.0.0.1:{cport}"
    log = open(os.path.join(root, "etcd.log"), "w")
    proc = subprocess.Popen(
        [ETCD, "--name", "s", "--data-dir", os.path.join(root, "etcd"),
         "--listen-client-urls", f"http://{endpoint}",
         "--advertise-client-urls", f"http://{endpoint}",
         "--listen-peer-urls", f"http://127.0.0.1:{pport}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{pport}",
         "--initial-cluster", f"s=http://127.0.0.1:{pport}"],
        stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            scrape(f"http://{endpoint}/metrics", [])
            return endpoint, proc
        except OSError:
            time.sleep(0.1)
    sys.exit("etcd did not start")


def wait_connected(nodes, deadline):
    """Every node ready, connected to etcd and watching for job dumps."""
    for n in nodes:
        n.wait_ready(deadline)
    while any(n.value("commd_cluster_connected") != 1 or
              n.value("commd_cluster_job_dumps_watching") != 1 for n in nodes):
        if time.time() > deadline:
            sys.exit("nodes did not connect")
        time.sleep(0.2)


def dump_files(nodes, dump_id):
    """Paths of every rank file of `dump_id` on every node."""
    out = []
    for n in nodes:
        d = os.path.join(n.dumps, "scale", dump_id)
        for root, _, files in os.walk(d):
            out += [os.path.join(root, f) for f in files if f.endswith(".json")]
    return out


def wait_for_files(nodes, dump_id, count, limit=60):
    end = time.time() + limit
    while time.time() < end:
        files = dump_files(nodes, dump_id)
        if len(files) >= count:
            return files
        time.sleep(0.002)
    sys.exit(f"dump {dump_id}: {len(dump_files(nodes, dump_id))} of {count} files")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=1, help="rank processes per node")
    ap.add_argument("--seconds", type=float, default=10, help="each rate's window")
    ap.add_argument("--dumps", type=int, default=3, help="job dumps asked on node 0")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    root = tempfile.mkdtemp(prefix="commd-scale-")
    procs = []
    try:
        etcd_endpoint, etcd = start_etcd(root)
        procs.append(etcd)
        etcd_metrics = f"http://{etcd_endpoint}/metrics"
        nodes = [Node(build, root, i, etcd_endpoint) for i in range(args.nodes)]
        procs += [n.proc for n in nodes]
        wait_connected(nodes, time.time() + 120)

        env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
        go = os.path.join(root, "go")
        world = args.nodes * args.ranks
        ranks = []
        for i, n in enumerate(nodes):
            for r in range(args.ranks):
                ranks.append(subprocess.Popen(
                    [sys.executable, "-c", RANK, n.run, n.name, str(r), str(args.ranks),
                     str(i * args.ranks + r), "g", "load", go],
                    env=env, stdout=subprocess.PIPE, text=True))
        procs += ranks
        for p in ranks:
            if p.stdout.readline().strip() != "JOINED":
                sys.exit("a rank did not join")

        names = ["etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total",
                 "etcd_server_proposals_committed_total",
                 "etcd_mvcc_db_total_size_in_use_in_bytes"]

        def rates(label):
            before = scrape(etcd_metrics, names)
            t0 = time.time()
            time.sleep(args.seconds)
            after = scrape(etcd_metrics, names)
            dt = time.time() - t0
            row = {k: (after[k] - before[k]) / dt for k in names}
            # History etcd keeps until a compaction: the growth of its database in use.
            grown = row["etcd_mvcc_db_total_size_in_use_in_bytes"]
            writes = row["etcd_mvcc_put_total"] + row["etcd_mvcc_delete_total"]
            per_write = f"{grown / writes:6.0f}" if writes > 0 else "     -"
            print(f"{label:8s} puts/s {row['etcd_mvcc_put_total']:8.1f}  "
                  f"deletes/s {row['etcd_mvcc_delete_total']:6.1f}  "
                  f"txns/s {row['etcd_mvcc_txn_total']:8.1f}  "
                  f"raft proposals/s {row['etcd_server_proposals_committed_total']:8.1f}  "
                  f"db in use +{grown:8.0f} B/s ({per_write} B a write)")
            return row

        print(f"# {args.nodes} nodes x {args.ranks} rank(s), one etcd, {args.seconds:.0f} s "
              f"windows; load average {os.getloadavg()[0]:.2f}")
        time.sleep(2)  # the joins' first views settle
        rates("rest")
        open(go, "w").close()
        rates("load")
        os.unlink(go)
        time.sleep(2)

        commctl = os.path.join(build, "tools/commctl/commctl")
        for k in range(args.dumps):
            t0 = time.time()
            out = subprocess.run([commctl, "--runtime-dir", nodes[0].run, "--json", "dump",
                                  "--job", "scale"], capture_output=True, text=True, check=True)
            t_answer = time.time()
            dump_id = json.loads(out.stdout)["dump_id"]
            files = wait_for_files(nodes, dump_id, world)
            t_all = max(os.stat(f).st_mtime for f in files)
            print(f"job dump {k}: node 0 answered in {1e3 * (t_answer - t0):7.1f} ms; "
                  f"every node's {len(files)} files written {1e3 * (t_all - t0):7.1f} ms "
                  f"after the request")

        # A hang on node 0: group h of 2 ranks there, rank 1 never enters.
        hang_env = dict(env, SCALE_TIMEOUT="2")
        h = [subprocess.Popen([sys.executable, "-c", RANK, nodes[0].run, nodes[0].name, str(r),
                               "2", str(world + r), "h", "enter-once" if r == 0 else "sleep"],
                              env=hang_env, stdout=subprocess.PIPE, text=True) for r in range(2)]
        procs += h
        for p in h:
            if p.stdout.readline().strip() != "JOINED":
                sys.exit("a hang rank did not join")
        found = None
        end = time.time() + 120
        while found is None and time.time() < end:
            for d in os.listdir(os.path.join(nodes[0].dumps, "scale")):
                if "-hang-" in d:
                    found = d
            time.sleep(0.01)
        if found is None:
            sys.exit("no hang dump on node 0")
        files = wait_for_files(nodes, found, world + 2)
        with open(next(f for f in files if "/h/" in f)) as f:
            detected_ms = int(json.load(f)["commd"]["diagnosis"]["detected_unix_ms"])
        t_all = max(os.stat(f).st_mtime for f in files)
        print(f"hang {found}: every node's {len(files)} files written "
              f"{t_all * 1e3 - detected_ms:7.1f} ms after the diagnosis")
        published = sum(n.value("commd_cluster_progress_writes_total") for n in nodes)
        print(f"views written by all nodes over the run: {published:.0f}")
        # The size of one view as etcd holds it: node 0's key of group g.
        out = subprocess.run(["/usr/bin/etcdctl", "--endpoints", etcd_endpoint, "get",
                              "--prefix", "/scale/progress/", "-w", "json"],
                             capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"))
        kvs = json.loads(out.stdout).get("kvs", []) if out.returncode == 0 else []
        if kvs:
            sizes = [len(base64.b64decode(kv["key"])) + len(base64.b64decode(kv.get("value", "")))
                     for kv in kvs]
            print(f"a view's key and value: {min(sizes)}-{max(sizes)} B ({len(kvs)} views)")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
