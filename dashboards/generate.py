#!/usr/bin/env python3
"""Writes the Grafana dashboards in this folder (commd-node.json, commd-fleet.json).

Edit the panels here and run `python3 dashboards/generate.py`; the JSON files are what
Grafana imports (Dashboards > New > Import) and are committed. The dashboards test checks
that they match this script's output, and sends every query to a real Prometheus.
"""
import json
import os

SCHEMA_VERSION = 39  # Grafana 10.4 / 11.x
DS = {"type": "prometheus", "uid": "${datasource}"}
# Every commd series is selected by the Prometheus job and the node (instance); per-group
# series also by the training job (commd's `job` label, which Prometheus renames
# exported_job) and the group, since two jobs may run groups of the same name.
NODE = 'job=~"$job",instance=~"$instance"'
GROUP = NODE + ',exported_job=~"$exported_job",group=~"$group"'


class Layout:
    """Places panels left to right in rows of 24 columns, as Grafana's grid does."""

    def __init__(self):
        self.panels = []
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_h = 0

    def _id(self):
        self.next_id += 1
        return self.next_id - 1

    def row(self, title):
        self._newline()
        self.panels.append({"id": self._id(), "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def panel(self, kind, title, targets, w=12, h=8, unit=None, description="", options=None,
              decimals=None):
        if self.x + w > 24:
            self._newline()
        defaults = {}
        if unit:
            defaults["unit"] = unit
        if decimals is not None:
            defaults["decimals"] = decimals
        panel = {
            "id": self._id(), "type": kind, "title": title, "description": description,
            "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {},
            "targets": [dict({"refId": chr(ord("A") + i), "datasource": DS}, **t)
                        for i, t in enumerate(targets)],
        }
        if kind == "timeseries":
            panel["options"] = dict({"legend": {"displayMode": "list", "placement": "bottom",
                                                "showLegend": True},
                                     "tooltip": {"mode": "multi", "sort": "desc"}},
                                    **panel["options"])
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def q(expr, legend="", instant=False, fmt=None):
    t = {"expr": expr, "legendFormat": legend, "range": not instant, "instant": instant}
    if fmt:
        t["format"] = fmt
    return t


def variable(name, label, query, multi=True, include_all=True):
    v = {"name": name, "label": label, "type": "query", "datasource": DS,
         "definition": query,
         "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
         "refresh": 2, "sort": 1, "multi": multi, "includeAll": include_all, "hide": 0,
         "regex": "", "current": {}, "options": []}
    if include_all:
        v["allValue"] = ".*"
    return v


def templating():
    return {"list": [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "refresh": 1, "hide": 0, "regex": "", "current": {},
         "options": []},
        variable("job", "Prometheus job", "label_values(commd_build_info, job)",
                 multi=False, include_all=False),
        variable("instance", "Node", 'label_values(commd_build_info{job=~"$job"}, instance)'),
        variable("exported_job", "Training job",
                 'label_values(commd_group_state{job=~"$job",instance=~"$instance"}, exported_job)'),
        variable("group", "Group",
                 'label_values(commd_group_state{job=~"$job",instance=~"$instance",'
                 'exported_job=~"$exported_job"}, group)'),
    ]}


def dashboard(uid, title, description, panels, tags):
    return {
        "uid": uid, "title": title, "description": description, "tags": tags,
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True,
        "graphTooltip": 1, "timezone": "", "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"}, "timepicker": {},
        "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [], "templating": templating(), "panels": panels,
    }


def node_dashboard():
    L = Layout()
    L.row("Groups and hangs")
    L.panel("table", "Groups by state", [q(
        f'max by (exported_job, group, state) (commd_group_state{{{GROUP}}}) == 1',
        instant=True, fmt="table")], w=8,
        description="Every group of every job on the node and the watchdog's state for it "
                    "(ok, suspect, hung, aborted). `commctl health` gives the diagnosis.")
    L.panel("timeseries", "Hangs detected by group and kind", [q(
        f'sum by (exported_job, group, kind) (increase(commd_hangs_detected_total{{{GROUP}}}'
        '[$__rate_interval]))',
        "{{exported_job}}/{{group}} {{kind}}")], w=8,
        description="stuck, lagging, mismatch, dead, unresponsive, rendezvous; per training "
                    "job and group")
    L.panel("timeseries", "Aborts by group and reason", [q(
        f'sum by (exported_job, group, reason) (increase(commd_aborts_total{{{GROUP}}}'
        '[$__rate_interval]))',
        "{{exported_job}}/{{group}} {{reason}}")], w=8)
    L.panel("timeseries", "NaN checks and NaN hits per second", [
        q(f'sum(rate(commd_nan_checks_total{{{GROUP}}}[$__rate_interval]))', "checks"),
        q(f'sum by (exported_job, group) (rate(commd_nan_detected_total{{{GROUP}}}'
          '[$__rate_interval]))', "NaN/Inf found {{exported_job}}/{{group}}"),
    ], w=12, unit="ops")
    L.panel("timeseries", "Seconds since each rank's last progress", [q(
        f'time() - commd_rank_last_progress_timestamp_seconds{{{GROUP}}}',
        "{{exported_job}}/{{group}} rank {{rank}}")], w=12, unit="s",
        description="Grows while a rank completes no collective. One line climbing while the "
                    "others stay low is a straggler or a hung rank.")
    L.row("Collectives")
    L.panel("timeseries", "Collectives per second by op", [q(
        f'sum by (op) (rate(commd_collectives_total{{{GROUP}}}[$__rate_interval]))', "{{op}}")],
        w=8, unit="ops")
    L.panel("timeseries", "Collective bytes per second by group", [q(
        f'sum by (exported_job, group) (rate(commd_collective_bytes_total{{{GROUP}}}'
        '[$__rate_interval]))',
        "{{exported_job}}/{{group}}")], w=8, unit="Bps",
        description="Input bytes of the completed collectives, summed over the group's ranks")
    L.panel("timeseries", "Collective duration quantiles", [
        q(f'histogram_quantile({p}, sum by (le, op) (rate('
          f'commd_collective_duration_seconds_bucket{{{GROUP}}}[$__rate_interval])))',
          f"p{int(p * 100)} {{{{op}}}}") for p in (0.5, 0.9, 0.99)], w=8, unit="s")
    L.row("Memory and flight recorder")
    L.panel("timeseries", "Memory held for clients by backend and device", [q(
        f'sum by (backend, device) (commd_memory_allocated_bytes{{{NODE}}})',
        "{{backend}} {{device}}")], w=8, unit="bytes")
    L.panel("timeseries", "Allocations by backend and lifetime", [q(
        f'sum by (backend, lifetime) (commd_allocations{{{NODE}}})',
        "{{backend}} {{lifetime}}")], w=8)
    L.panel("timeseries", "Flight-recorder dumps by trigger", [q(
        f'sum by (trigger) (increase(commd_flight_recorder_dumps_total{{{NODE}}}[$__rate_interval]))',
        "{{trigger}}")], w=8)
    L.panel("timeseries", "Flight-recorder entries and drops per second", [
        q(f'sum by (exported_job, group) (rate(commd_flight_recorder_entries_total{{{GROUP}}}'
          '[$__rate_interval]))', "entries {{exported_job}}/{{group}}"),
        q(f'sum by (exported_job, group) (rate(commd_flight_recorder_dropped_total{{{GROUP}}}'
          '[$__rate_interval]))', "dropped {{exported_job}}/{{group}}"),
        q(f'sum(rate(commd_flight_recorder_invalid_entries_total{{{NODE}}}[$__rate_interval]))',
          "invalid"),
    ], w=24, unit="ops",
        description="Dropped: overwritten before any dump read them (raise "
                    "recorder.ring_capacity for longer history). Invalid: entries a client "
                    "corrupted.")
    L.row("Daemon")
    L.panel("timeseries", "RPC latency and watchdog poll time, p99", [q(
        f'histogram_quantile(0.99, sum by (le, method) (rate('
        f'commd_rpc_duration_seconds_bucket{{{NODE}}}[$__rate_interval])))', "{{method}}"),
        q(f'histogram_quantile(0.99, sum by (le) (rate('
          f'commd_watchdog_poll_duration_seconds_bucket{{{NODE}}}[$__rate_interval])))',
          "watchdog poll")],
        w=8, unit="s")
    L.panel("timeseries", "RPC errors per second by method and code", [q(
        f'sum by (method, code) (rate(commd_rpc_errors_total{{{NODE}}}[$__rate_interval]))',
        "{{method}} {{code}}")], w=8, unit="ops")
    L.panel("timeseries", "Sessions, groups and rendezvous time", [
        q(f'sum(commd_sessions{{{NODE}}})', "sessions"),
        q(f'sum(commd_groups{{{NODE}}})', "groups"),
        q(f'histogram_quantile(0.9, sum by (le) (rate('
          f'commd_rendezvous_duration_seconds_bucket{{{NODE}}}[$__rate_interval])))',
          "rendezvous p90 (s)"),
    ], w=8)
    L.panel("table", "Topology and version", [
        q(f'commd_topology_info{{{NODE}}}', instant=True, fmt="table"),
        q(f'commd_build_info{{{NODE}}}', instant=True, fmt="table"),
        q(f'time() - commd_start_time_seconds{{{NODE}}}', instant=True, fmt="table"),
    ], w=24, h=6, description="GPUs, NICs, NUMA nodes and the link classification "
                               "(FULLY_CONNECTED, HYBRID_CUBE_MESH, PARTIAL, NONE); version "
                               "and uptime. `commctl topo` shows the link matrix.")
    return dashboard("commd-node", "commd: node comm health",
                     "One GPU node's commd: groups and their watchdog state, hangs, aborts, "
                     "NaNs, collectives, memory, flight recorder, RPCs, topology.",
                     L.panels, ["commd"])


def fleet_dashboard():
    L = Layout()
    ALL = 'job=~"$job",instance=~"$instance"'
    L.row("Fleet")
    L.panel("stat", "Nodes with commd up", [q(f'count(up{{{ALL}}} == 1) or vector(0)', instant=True)],
            w=6, h=4)
    L.panel("stat", "Nodes with commd down", [q(f'count(up{{{ALL}}} == 0) or vector(0)', instant=True)],
            w=6, h=4)
    L.panel("stat", "Nodes with hung groups", [q(
        f'count(count by (instance) (commd_group_state{{{ALL},state="hung"}} == 1)) or vector(0)',
        instant=True)], w=6, h=4)
    L.panel("stat", "NaN/Inf found in the last hour", [q(
        f'sum(increase(commd_nan_detected_total{{{ALL}}}[1h])) or vector(0)', instant=True)],
        w=6, h=4)
    L.panel("table", "Nodes with hung groups", [q(
        f'max by (instance, exported_job, group) (commd_group_state{{{ALL},'
        'exported_job=~"$exported_job",group=~"$group",state="hung"}) == 1',
        instant=True, fmt="table")], w=12,
        description="Run `commctl health` on the node; the dump names the ranks behind.")
    L.panel("table", "Top aborts (last hour)", [q(
        f'topk(10, sum by (instance, exported_job, group, reason) '
        f'(increase(commd_aborts_total{{{ALL}}}[1h])))',
        instant=True, fmt="table")], w=12)
    L.panel("table", "NaN hot spots (last hour)", [q(
        f'topk(10, sum by (instance, exported_job, group) '
        f'(increase(commd_nan_detected_total{{{ALL},exported_job=~"$exported_job"}}[1h])))',
        instant=True, fmt="table")], w=12)
    L.panel("timeseries", "Hangs by training job and kind", [q(
        f'sum by (exported_job, kind) (increase(commd_hangs_detected_total{{{ALL}}}'
        '[$__rate_interval]))',
        "{{exported_job}} {{kind}}")], w=12)
    L.panel("timeseries", "Collectives per second by node", [q(
        f'sum by (instance) (rate(commd_collectives_total{{{ALL}}}[$__rate_interval]))',
        "{{instance}}")], w=12, unit="ops")
    L.panel("timeseries", "Memory held by node", [q(
        f'sum by (instance) (commd_memory_allocated_bytes{{{ALL}}})', "{{instance}}")],
        w=12, unit="bytes")
    L.panel("table", "Versions", [q(f'count by (version) (commd_build_info{{{ALL}}})',
                                    instant=True, fmt="table")], w=12, h=6)
    L.panel("table", "Flight-recorder drops by node (last hour)", [q(
        f'topk(10, sum by (instance) (increase(commd_flight_recorder_dropped_total{{{ALL}}}[1h])))',
        instant=True, fmt="table")], w=12, h=6)
    L.row("Cluster (etcd)")
    L.panel("stat", "Nodes connected to etcd", [q(
        f'sum(commd_cluster_connected{{{ALL}}}) or vector(0)', instant=True)], w=6, h=4,
        description="Daemons holding their lease in the cluster's etcd (docs/cluster.md).")
    L.panel("stat", "Nodes cut off from etcd", [q(
        f'count(commd_cluster_connected{{{ALL}}} == 0) or vector(0)', instant=True)], w=6, h=4,
        description="Node-local work goes on; the job store fails and dumps are not announced.")
    L.panel("stat", "Nodes etcd lists", [q(
        f'max(commd_cluster_nodes{{{ALL}}}) or vector(0)', instant=True)], w=6, h=4,
        description="Live node keys as a daemon last counted them: fewer than the nodes "
                    "scraped means a daemon lost its lease.")
    L.panel("stat", "Nodes not watching for job dumps", [q(
        f'count(commd_cluster_job_dumps_watching{{{ALL}}} == 0) or vector(0)', instant=True)],
        w=6, h=4)
    L.panel("timeseries", "Job dumps across nodes", [q(
        f'sum by (event) (increase(commd_cluster_job_dumps_total{{{ALL}}}[$__rate_interval]))',
        "{{event}}")], w=12,
        description="Dumps of jobs announced by a node (published), failed to announce, and "
                    "seen by the other nodes (received).")
    L.panel("timeseries", "Group views written to etcd per second", [q(
        f'sum by (instance) (rate(commd_cluster_progress_writes_total{{{ALL}}}'
        '[$__rate_interval]))', "{{instance}}")], w=12, unit="ops",
        description="On change, at most one per group per cluster.progress_interval_ms: the "
                    "write rate commd puts on etcd (docs/PERFORMANCE.md).")
    L.panel("timeseries", "Aborts of spanning groups across nodes", [q(
        f'sum by (event) (increase(commd_cluster_span_aborts_total{{{ALL}}}[$__rate_interval]))',
        "{{event}}")], w=12,
        description="A group spanning nodes aborted on one node is aborted on the others: "
                    "announcements sent, failed to send (that node was cut off from etcd), "
                    "received from other nodes, applied (ranks aborted here), and rejected "
                    "(keys or values under <prefix>/aborts/ that commd did not write) "
                    "(docs/cluster.md, \"An abort across nodes\").")
    L.panel("timeseries", "Node lease: seconds left", [
        q(f'commd_cluster_lease_remaining_seconds{{{ALL}}}', "{{instance}} left"),
        q(f'commd_cluster_lease_ttl_seconds{{{ALL}}}', "{{instance}} TTL")], w=12, unit="s",
        description="Per node: what is left of its lease in etcd (what etcd's last keep-alive "
                    "answer left, less the time since) against the TTL it was granted. It "
                    "falls from the TTL to two thirds of it between keep-alives; lower means "
                    "keep-alives go unanswered, and at 0 the other nodes count the node as "
                    "gone and abort the groups spanning it (docs/cluster.md).")
    L.panel("timeseries", "Node lease: keep-alives not answered, per second", [q(
        f'sum by (instance) (rate(commd_cluster_lease_keepalives_total'
        f'{{{ALL},result!="ok"}}[$__rate_interval]))', "{{instance}}")], w=12, unit="ops",
        description="Per node: keep-alives of its lease etcd did not answer (failed: etcd "
                    "unreachable or slower than cluster.call_timeout_ms) or answered that the "
                    "lease was gone (expired: the node registers again on a new lease).")
    L.panel("stat", "Nodes not watching for aborts across nodes", [q(
        f'count(commd_cluster_span_aborts_watching{{{ALL}}} == 0) or vector(0)', instant=True)],
        w=6, h=4,
        description="Such a node does not abort its part of a group another node aborted "
                    "until it watches again (it then catches up, within the keys' 60 s).")
    return dashboard("commd-fleet", "commd: fleet overview",
                     "Every node's commd: which nodes have hung groups, where aborts and NaNs "
                     "happen, traffic and memory per node.", L.panels, ["commd"])


def render(d):
    return json.dumps(d, indent=2, sort_keys=False) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for name, d in (("commd-node.json", node_dashboard()), ("commd-fleet.json", fleet_dashboard())):
        with open(os.path.join(here, name), "w") as f:
            f.write(render(d))


if __name__ == "__main__":
    main()
