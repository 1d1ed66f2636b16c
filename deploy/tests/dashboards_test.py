#!/usr/bin/env python3
"""Dashboards and alert rules against real servers.

Starts Debian's etcd and two real commd daemons as the nodes of one cluster on temporary
runtime dirs, and Debian's prometheus on loopback scraping both (a free
port, temporary storage, 1 s scrape and rule interval, deploy/prometheus/commd.rules.yml
loaded), runs a small demo job of examples/trainer ranks with one hang and one NaN injected
(and one more hang that commctl aborts) beside a healthy second job whose group has the name
of the demo's hung one (tp), then:
  - checks each dashboard's JSON: schemaVersion, the datasource/job/instance/group
    variables, unique panel ids, grid positions inside the 24 columns and not overlapping,
    every panel on the ${datasource} variable, the JSON matching dashboards/generate.py;
  - resolves the template variables through Prometheus's series API, substitutes them into
    every query of every panel, sends each to /api/v1/query and requires success and data;
  - requires every commd metric a query names to exist in commd's /metrics;
  - requires the alerts the demo provokes to fire in that Prometheus;
  - requires the hang alert to name the hung job and group only, and the healthy job's group
    of the same name to stay ok in Prometheus while the demo's is hung.

Usage: dashboards_test.py --source DIR --commd BIN --commctl BIN --trainer BIN
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

failures = []
procs = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, log_path, env=None):
    log = open(log_path, "w")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                         start_new_session=True)
    p.log_path = log_path
    procs.append(p)
    return p


def read(path):
    with open(path) as f:
        return f.read()


def wait_for(what, pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception:  # not up yet
            pass
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def http_get(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode()
    except urllib.error.HTTPError as e:  # Prometheus puts its error in the body
        raise RuntimeError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')}") from None


def scrape_families(metrics_url):
    """Metric names commd exposes, with the series names histograms add."""
    names = set()
    for line in http_get(metrics_url).splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            names.add(m.group(1))
            if m.group(2) in ("histogram", "summary"):
                names |= {m.group(1) + s for s in ("_bucket", "_sum", "_count")}
    return names


def scrape_value(metrics_url, name, labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    total, found = 0.0, False
    for line in http_get(metrics_url).splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


class Prometheus:
    def __init__(self, base):
        self.base = base

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        body = json.loads(http_get(url))
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)

    def label_values(self, selector, label):
        series = self.api("series", **{"match[]": selector, "start": time.time() - 600})
        return sorted({s[label] for s in series if label in s})


# Grafana's built-in interval variables, as they would be on a short time range.
BUILTINS = {"$__rate_interval": "10s", "$__interval": "1s", "$__range": "2m"}


def substitute(expr, values):
    for k, v in BUILTINS.items():
        expr = expr.replace(k, v)
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def resolve_variables(dash, prom, title):
    values = {}
    for v in dash["templating"]["list"]:
        if v["type"] == "datasource":
            check(v.get("query") == "prometheus", f"{title}: datasource variable is not prometheus")
            continue
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["definition"].strip())
        if not check(m, f"{title}: variable {v['name']} is not label_values(...): {v['definition']}"):
            continue
        selector = substitute(m.group(1), values)
        found = prom.label_values(selector, m.group(2))
        check(found, f"{title}: variable {v['name']} ({v['definition']}) has no values")
        if v.get("multi") or v.get("includeAll"):
            # As Grafana formats a multi-value for Prometheus: regex-escaped, and the
            # backslashes doubled inside PromQL's double-quoted string.
            values[v["name"]] = "|".join(re.escape(x).replace("\\", "\\\\") for x in found) or ".*"
        else:
            values[v["name"]] = found[0] if found else ""
    return values


def check_structure(dash, title):
    check(dash.get("schemaVersion", 0) >= 39, f"{title}: schemaVersion {dash.get('schemaVersion')} < 39")
    names = [v["name"] for v in dash["templating"]["list"]]
    for n in ("datasource", "job", "instance", "group"):
        check(n in names, f"{title}: no ${n} variable")
    ids = [p["id"] for p in dash["panels"]]
    check(len(ids) == len(set(ids)), f"{title}: duplicate panel ids {ids}")
    cells = {}
    for p in dash["panels"]:
        g = p.get("gridPos", {})
        ok = all(isinstance(g.get(k), int) for k in "hwxy") and g["w"] > 0 and g["h"] > 0 \
            and g["x"] >= 0 and g["y"] >= 0 and g["x"] + g["w"] <= 24
        if not check(ok, f"{title}: panel {p['id']} has an invalid gridPos {g}"):
            continue
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                check((x, y) not in cells, f"{title}: panels {cells.get((x, y))} and {p['id']} overlap")
                cells[(x, y)] = p["id"]
        if p["type"] != "row":
            check(p.get("datasource", {}).get("uid") == "${datasource}",
                  f"{title}: panel {p['id']} is not on the $datasource variable")
            check(p.get("targets"), f"{title}: panel {p['id']} has no query")


def queries(dash):
    for p in dash["panels"]:
        for t in p.get("targets", []):
            yield p, t


def check_queries(dash, title, prom, families, instances):
    values = resolve_variables(dash, prom, title)
    n = 0
    for p, target in queries(dash):
        expr = target["expr"]
        for metric in set(re.findall(r"\b(commd_[a-z0-9_]+)", expr)):
            check(metric in families, f"{title}: panel {p['id']} '{p['title']}' names {metric}, "
                                      "which commd's /metrics does not have")
        q = substitute(expr, values)
        check("$" not in q, f"{title}: unsubstituted variable in {q}")
        try:
            result = prom.query(q)["result"]
        except Exception as e:
            check(False, f"{title}: panel {p['id']} '{p['title']}': {e}")
            continue
        check(result, f"{title}: panel {p['id']} '{p['title']}' has no data: {q}")
        if p["title"] in PER_NODE_PANELS:
            # One series per scraped daemon, each of its own node (data from some other series,
            # or from one node only, would hide a node whose lease is not reported).
            seen = sorted(r.get("metric", {}).get("instance", "") for r in result)
            check(seen == sorted(instances),
                  f"{title}: panel '{p['title']}' has series for instances {seen}, "
                  f"not one for each daemon {sorted(instances)}: {q}")
        # A legend naming a label the series lack renders blank in Grafana.
        for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
            check(all(label in r.get("metric", {}) for r in result),
                  f"{title}: panel {p['id']} '{p['title']}': legend names {{{{{label}}}}}, "
                  f"which the series of {q} lack")
        n += 1
    print(f"{title}: {n} queries answered with data" if not failures else f"{title}: {n} queries sent")


def main():
    ap = argparse.ArgumentParser()
    for a in ("--source", "--commd", "--commctl", "--trainer"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    src = args.source
    prom_bin = shutil.which("prometheus")
    if not prom_bin:
        print("FAIL: prometheus missing (Debian package prometheus)")
        return 1
    if not os.access(ETCD, os.X_OK):
        print(f"FAIL: {ETCD} missing (Debian package etcd-server)")
        return 1

    dashboards = {}
    for name in ("commd-node.json", "commd-fleet.json"):
        with open(os.path.join(src, "dashboards", name)) as f:
            dashboards[name] = json.load(f)
    # The committed JSON is what generate.py writes.
    with tempfile.TemporaryDirectory() as gen:
        shutil.copy(os.path.join(src, "dashboards", "generate.py"), gen)
        subprocess.run([sys.executable, os.path.join(gen, "generate.py")], check=True)
        for name in dashboards:
            check(read(os.path.join(gen, name)) == read(os.path.join(src, "dashboards", name)),
                  f"dashboards/{name} differs from what dashboards/generate.py writes")
    for name, d in dashboards.items():
        check_structure(d, name)

    tmp = tempfile.mkdtemp(prefix="commd-dash-")
    try:
        run_with_servers(args, src, tmp, prom_bin, dashboards)
    except Exception as e:  # a timeout names what never happened
        failures.append(f"{type(e).__name__}: {e}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if failures:
            for p in procs:
                print(f"--- {p.args[0]} log (tail) ---\n" + read(p.log_path)[-2000:])
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def start_etcd(tmp):
    """Debian's etcd on free loopback ports; returns its client endpoint."""
    client, peer = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    start([ETCD, "--name", "d", "--data-dir", os.path.join(tmp, "etcd"),
           "--listen-client-urls", f"http://{client}", "--advertise-client-urls", f"http://{client}",
           "--listen-peer-urls", f"http://{peer}", "--initial-advertise-peer-urls", f"http://{peer}",
           "--initial-cluster", f"d=http://{peer}"], os.path.join(tmp, "etcd.log"))
    wait_for("etcd ready", lambda: "ready to serve client requests" in read(os.path.join(tmp, "etcd.log")), 60)
    return client


def start_node(args, tmp, name, etcd):
    """A daemon as cluster node `name`; returns (runtime dir, metrics address)."""
    run = os.path.join(tmp, name, "run")
    os.makedirs(run)
    config = os.path.join(tmp, name, "commd.textproto")
    with open(config, "w") as f:
        f.write(DAEMON_CONFIG.format(etcd=etcd, node=name))
    daemon = start([args.commd, "--config", config, "--runtime-dir", run,
                    "--metrics-address", "127.0.0.1:0",
                    "--dump-dir", os.path.join(tmp, name, "dumps")],
                   os.path.join(tmp, f"commd-{name}.log"))
    address = wait_for(f"commd {name} ready", lambda: re.search(r"metrics http://(\S+)/metrics",
                                                                read(daemon.log_path)), 30).group(1)
    return run, address


def run_with_servers(args, src, tmp, prom_bin, dashboards):
    # Two nodes of one cluster: the demo runs on node-a; node-b is a second node the fleet
    # dashboard's cluster panels count.
    etcd = start_etcd(tmp)
    run, address = start_node(args, tmp, "node-a", etcd)
    _, address_b = start_node(args, tmp, "node-b", etcd)
    metrics_url = f"http://{address}/metrics"
    for a in (address, address_b):
        wait_for(f"{a} connected to etcd",
                 lambda: scrape_value(f"http://{a}/metrics", "commd_cluster_connected", {}) == 1, 60)

    port = free_port()
    shutil.copy(os.path.join(src, "deploy", "prometheus", "commd.rules.yml"), tmp)
    with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
        f.write(PROMETHEUS_CONFIG.format(targets=f'"{address}", "{address_b}"'))
    start([prom_bin, f"--config.file={tmp}/prometheus.yml", f"--storage.tsdb.path={tmp}/tsdb",
           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
          os.path.join(tmp, "prometheus.log"))
    prom = Prometheus(f"http://127.0.0.1:{port}")

    env = dict(os.environ, COMMD_RUNTIME_DIR=run, COMMD_JOB_ID="demo")
    # Hangs are found after the group timeout (3 s); the waiting ranks wait longer than the
    # test, so the hung group stays hung until commctl aborts it (pp) or the test ends (tp).
    common = ["--steps", "1000000", "--step-ms", "20", "--count", "1024", "--quiet",
              "--timeout-ms", "3000", "--wait-ms", "300000"]
    job = [("dp", 0, []), ("dp", 1, ["--nan-at-step", "10"]),
           ("tp", 0, []), ("tp", 1, ["--hang-at-step", "20"]),
           ("pp", 0, []), ("pp", 1, ["--hang-at-step", "5"])]
    for group, rank, extra in job:
        start([args.trainer, "--group", group, "--rank", str(rank), "--world", "2"] + common + extra,
              os.path.join(tmp, f"{group}{rank}.log"), env=env)
    # A second job with a group named like the demo's hung one, healthy throughout (a long
    # group timeout, so that a loaded machine's scheduling is no hang).
    healthy = [("60000" if a == "3000" else a) for a in common]
    for rank in (0, 1):
        start([args.trainer, "--group", "tp", "--rank", str(rank), "--world", "2"] + healthy,
              os.path.join(tmp, f"other-tp{rank}.log"), env=dict(env, COMMD_JOB_ID="other"))

    def state(job, group, s):
        return scrape_value(metrics_url, "commd_group_state",
                            {"job": job, "group": group, "state": s}) == 1
    wait_for("demo's tp and pp hung, other's tp ok",
             lambda: state("demo", "tp", "hung") and state("demo", "pp", "hung")
             and state("other", "tp", "ok"), 60)
    ctl = [args.commctl, "--runtime-dir", run]
    out = subprocess.run(ctl + ["abort", "--group", "pp", "--job", "demo", "--reason", "dashboard test"],
                         capture_output=True, text=True, env=env, timeout=30)
    check(out.returncode == 0, f"commctl abort: {out.stdout}{out.stderr}")
    out = subprocess.run(ctl + ["dump", "--job", "demo"], capture_output=True, text=True, env=env, timeout=30)
    check(out.returncode == 0, f"commctl dump: {out.stdout}{out.stderr}")
    # One failing call, so that the RPC error panel has a series.
    subprocess.run(ctl + ["dump", "--group", "no-such-group"], capture_output=True, env=env, timeout=30)
    wait_for("the abort counted", lambda: (scrape_value(metrics_url, "commd_aborts_total", {}) or 0) > 0, 30)
    # The job dump was announced in etcd (the demo runs on node-a alone, so node-b only sees it).
    wait_for("node-b saw the job dump",
             lambda: (scrape_value(f"http://{address_b}/metrics", "commd_cluster_job_dumps_total",
                                   {"event": "received"}) or 0) > 0, 30)
    wait_for("prometheus counts both nodes in etcd",
             lambda: [r for r in prom.query("max(commd_cluster_nodes) == 2")["result"]], 60)

    # Prometheus holds several scrapes after the last event.
    wait_for("prometheus has the abort", lambda: prom.query("commd_aborts_total")["result"], 30)
    time.sleep(5)

    families = scrape_families(metrics_url)
    for name, d in dashboards.items():
        check_queries(d, name, prom, families, [address, address_b])
    check_leases(prom, [address, address_b])

    def firing():
        return {a["labels"]["alertname"] for a in prom.api("alerts")["alerts"] if a["state"] == "firing"}
    deadline = time.time() + 20
    while not firing() >= EXPECTED_ALERTS and time.time() < deadline:
        time.sleep(0.5)
    now = firing()
    check(now >= EXPECTED_ALERTS, f"alerts {sorted(EXPECTED_ALERTS - now)} do not fire (firing: {sorted(now)})")
    print("alerts firing:", sorted(now))
    check_two_jobs(prom)


def check_leases(prom, instances):
    """Each node's lease as Prometheus has it: granted its TTL, something left, nothing more."""
    ttl = {r["metric"]["instance"]: float(r["value"][1])
           for r in prom.query("commd_cluster_lease_ttl_seconds")["result"]}
    left = {r["metric"]["instance"]: float(r["value"][1])
            for r in prom.query("commd_cluster_lease_remaining_seconds")["result"]}
    for i in instances:
        check(ttl.get(i) == 2, f"{i}: commd_cluster_lease_ttl_seconds is {ttl.get(i)}, not 2")
        check(i in left and 0 < left[i] <= 2,
              f"{i}: commd_cluster_lease_remaining_seconds is {left.get(i)}, not in (0, 2]")


def check_two_jobs(prom):
    """The demo's hung tp alerts under its own job; the other job's tp stays ok and quiet."""
    hangs = [a["labels"] for a in prom.api("alerts")["alerts"]
             if a["labels"]["alertname"] == "CommdHangDetected" and a["state"] == "firing"]
    named = {(h.get("exported_job"), h.get("group")) for h in hangs}
    check(("demo", "tp") in named, f"CommdHangDetected does not name job demo's tp: {hangs}")
    check(named <= {("demo", "tp"), ("demo", "pp")},
          f"CommdHangDetected fires for other than demo's tp and pp: {hangs}")

    def value(expr):
        result = prom.query(expr)["result"]
        return [float(r["value"][1]) for r in result]
    check(value('commd_group_state{exported_job="other",group="tp",state="ok"}') == [1.0],
          "job other's tp is not ok in Prometheus while job demo's tp is hung")
    check(value('commd_group_state{exported_job="other",group="tp",state="hung"}') == [0.0],
          "job other's tp is hung in Prometheus")
    check(value('commd_group_state{exported_job="demo",group="tp",state="hung"}') == [1.0],
          "job demo's tp is not hung in Prometheus")
    check(not prom.query('commd_hangs_detected_total{exported_job="other"}')["result"],
          "a hang is counted for job other")


# The trainer's Group::AllReduce runs the fused NaN check, so dp's injected NaN reaches
# commd_nan_detected_total and CommdNaNDetected fires.
ETCD = "/usr/bin/etcd"

# Panels that must show one series per daemon (check_queries), each labelled by its instance.
PER_NODE_PANELS = {"Node lease: seconds left", "Node lease: keep-alives not answered, per second"}

EXPECTED_ALERTS = {"CommdHangDetected", "CommdGroupAborted", "CommdNaNDetected"}

DAEMON_CONFIG = """
# Defaults: policy REPORT, so the hung groups stay hung for the dashboards (pp is aborted by
# commctl); the trainers' 3 s group timeout makes the watchdog find the hangs within seconds.
# A cluster on the test's etcd, with a short lease so that nodes are counted every ~7 s.
cluster {{ etcd_endpoints: "{etcd}" node_name: "{node}" prefix: "/dashboards" lease_ttl_ms: 2000 }}
"""

PROMETHEUS_CONFIG = """
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [commd.rules.yml]
scrape_configs:
  - job_name: commd
    static_configs:
      - targets: [{targets}]
"""


if __name__ == "__main__":
    try:
        rc = main()
    except Exception as e:  # a timeout names what never happened
        failures.append(f"{type(e).__name__}: {e}")
        rc = 1
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    sys.exit(rc)
