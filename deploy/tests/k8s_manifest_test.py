#!/usr/bin/env python3
"""Checks deploy/k8s/commd-daemonset.yaml and deploy/k8s/etcd.yaml.

The DaemonSet: valid YAML, and what a commd node daemon needs (hostPath runtime and dump
dirs, hostIPC, the NVIDIA devices, probes on the metrics endpoint, scrape annotations, the
node's name from the downward API). Then starts the real commd on the ConfigMap's config
(runtime dir, metrics address and dump dir overridden by flags to temporary ones), so a
config the daemon rejects fails here.

etcd: a StatefulSet of an odd number of members behind a headless Service whose names the
members' --initial-cluster and commd's cluster.etcd_endpoints use, every etcd flag known to
the real etcd (Debian's, /usr/bin/etcd), a NetworkPolicy that lets commd's pods reach the
client port. Then starts the real etcd on loopback with the manifest's flags (the addresses
and the member list replaced: one member) and its probe's /health, and the real commd on the
ConfigMap's config pointed at it, with the container's command as Kubernetes expands it
($(NODE_NAME) from the downward API): the node registers in etcd under that name.

Usage: k8s_manifest_test.py DAEMONSET_MANIFEST ETCD_MANIFEST COMMD_BINARY
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
NODE_NAME = "gpu-node-7"  # what the downward API would give


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def main():
    manifest, etcd_manifest, commd = sys.argv[1], sys.argv[2], sys.argv[3]
    docs = load(manifest)
    kinds = {d["kind"]: d for d in docs}
    for kind in ("Namespace", "ConfigMap", "DaemonSet"):
        check(kind in kinds, f"no {kind} in {manifest}")
    for d in docs:
        check("apiVersion" in d and "metadata" in d and "name" in d["metadata"],
              f"{d.get('kind')} lacks apiVersion or metadata.name")
    ds = kinds["DaemonSet"]
    check(ds["apiVersion"] == "apps/v1", "DaemonSet apiVersion is not apps/v1")
    spec = ds["spec"]
    tmpl = spec["template"]
    check(spec["selector"]["matchLabels"].items() <= tmpl["metadata"]["labels"].items(),
          "selector.matchLabels does not match the pod template's labels")
    ann = tmpl["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true", "no prometheus.io/scrape: \"true\"")
    check(ann.get("prometheus.io/path") == "/metrics", "prometheus.io/path is not /metrics")
    pod = tmpl["spec"]
    check(pod.get("hostIPC") is True, "hostIPC is not true")
    check(pod.get("runtimeClassName") == "nvidia", "runtimeClassName is not nvidia")
    containers = pod["containers"]
    check(len(containers) == 1, "expected one container")
    c = containers[0]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    check(env.get("NVIDIA_VISIBLE_DEVICES") == "all", "NVIDIA_VISIBLE_DEVICES is not all")
    check("compute" in (env.get("NVIDIA_DRIVER_CAPABILITIES") or ""),
          "NVIDIA_DRIVER_CAPABILITIES lacks compute")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(ports.get("metrics") == 9464, "no metrics port 9464")
    check(str(ports.get("metrics")) == ann.get("prometheus.io/port"),
          "prometheus.io/port differs from the metrics port")
    for probe in ("livenessProbe", "readinessProbe"):
        get = c.get(probe, {}).get("httpGet", {})
        check(get.get("path") == "/metrics" and get.get("port") in ("metrics", 9464),
              f"{probe} is not an HTTP GET of /metrics on the metrics port")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    for path in ("/run/commd", "/var/lib/commd/dumps"):
        name = mounts.get(path)
        check(name is not None, f"nothing mounted at {path}")
        if name:
            check(volumes[name].get("hostPath", {}).get("path") == path,
                  f"{path} is not a hostPath of the same path")
    check(c["securityContext"].get("allowPrivilegeEscalation") is False,
          "allowPrivilegeEscalation is not false")
    check(mounts.get("/etc/commd") == "config", "the ConfigMap is not mounted at /etc/commd")
    cmd = c["command"]
    check(cmd[:3] == ["/usr/bin/commd", "--config", "/etc/commd/commd.textproto"],
          "command is not commd --config /etc/commd/commd.textproto")
    # The node's name in the cluster: the Kubernetes node's, from the downward API.
    node_env = [e for e in c.get("env", []) if e["name"] == "NODE_NAME"]
    check(node_env and node_env[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "spec.nodeName", "no env NODE_NAME from the downward API's spec.nodeName")
    check(cmd[3:] == ["--node-name", "$(NODE_NAME)"], "command does not end --node-name $(NODE_NAME)")
    config = kinds["ConfigMap"]["data"]["commd.textproto"]
    check_config_with_daemon(commd, config)
    etcd_docs = load(etcd_manifest)
    members = check_etcd_manifest(etcd_docs, ds)
    endpoints = re.findall(r'etcd_endpoints:\s*"([^"]+)"', config)
    check(sorted(endpoints) == sorted(f"{m}:2379" for m in members),
          f"the ConfigMap's cluster.etcd_endpoints {endpoints} are not the etcd members {members} "
          "on the client port")
    check(re.search(r"^\s*node_name:", config, re.M) is None,
          "the ConfigMap sets cluster.node_name: one config for every node would give all one name")
    if not os.access(ETCD, os.X_OK):
        failures.append(f"{ETCD} missing (Debian package etcd-server)")
        return
    check_with_real_etcd(commd, config, etcd_docs, cmd)


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def flags_of(command):
    """--flag=value arguments as a dict (etcd's own form)."""
    out = {}
    for a in command[1:]:
        check(a.startswith("--") and "=" in a, f"etcd argument {a!r} is not --flag=value")
        k, _, v = a.partition("=")
        out[k] = v
    return out


def check_etcd_manifest(docs, ds):
    """The StatefulSet, its Services, budget and policy; returns the members' client hosts."""
    ns = ds["metadata"]["namespace"]
    for d in docs:
        check(d["metadata"].get("namespace") == ns, f"etcd's {d['kind']} is not in namespace {ns}")
    sets = by_kind(docs, "StatefulSet")
    if not check(len(sets) == 1, "etcd.yaml: expected one StatefulSet"):
        return []
    sts = sets[0]
    spec = sts["spec"]
    replicas = spec["replicas"]
    check(replicas >= 3 and replicas % 2 == 1, f"etcd replicas {replicas}: want an odd number >= 3")
    labels = spec["template"]["metadata"]["labels"]
    check(spec["selector"]["matchLabels"].items() <= labels.items(),
          "etcd selector.matchLabels does not match the pod template's labels")
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    headless = services.get(spec["serviceName"])
    if not check(headless is not None, f"no Service {spec['serviceName']} (the serviceName)"):
        return []
    check(headless["spec"].get("clusterIP") == "None", "the peer Service is not headless")
    check(headless["spec"].get("publishNotReadyAddresses") is True,
          "the peer Service does not publish not-ready members (they could never meet)")
    for s in services.values():
        check(s["spec"]["selector"].items() <= labels.items(),
              f"Service {s['metadata']['name']} does not select the etcd pods")
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    flags = flags_of(c["command"])
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.name", "no env POD_NAME from metadata.name")
    name, svc = sts["metadata"]["name"], spec["serviceName"]
    members = [f"{name}-{i}.{svc}.{ns}.svc" for i in range(replicas)]
    check(flags.get("--name") == "$(POD_NAME)", "--name is not $(POD_NAME)")
    want = ",".join(f"{name}-{i}=http://{m}:2380" for i, m in enumerate(members))
    check(flags.get("--initial-cluster") == want,
          f"--initial-cluster {flags.get('--initial-cluster')} is not the members {want}")
    check(flags.get("--initial-advertise-peer-urls") == f"http://$(POD_NAME).{svc}.{ns}.svc:2380",
          "--initial-advertise-peer-urls is not the member's own name")
    check(flags.get("--advertise-client-urls") == f"http://$(POD_NAME).{svc}.{ns}.svc:2379",
          "--advertise-client-urls is not the member's own name")
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    check(mounts.get(flags.get("--data-dir")) in claims,
          "--data-dir is not on a volume claim of the StatefulSet")
    metrics_port = {p["name"]: p["containerPort"] for p in c["ports"]}.get("metrics")
    check(flags.get("--listen-metrics-urls") == f"http://0.0.0.0:{metrics_port}",
          "--listen-metrics-urls is not the metrics port")
    for probe in ("readinessProbe", "livenessProbe"):
        get = c.get(probe, {}).get("httpGet", {})
        check(get.get("path") == "/health" and get.get("port") in ("metrics", metrics_port),
              f"etcd's {probe} is not GET /health on the metrics port")
    # Every flag is one the real etcd knows (its --help lists them).
    if os.access(ETCD, os.X_OK):
        known = subprocess.run([ETCD, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True).stdout
        for f in flags:
            check(re.search(r"(^|\s)" + re.escape(f) + r"\b", known),
                  f"etcd {ETCD} does not know {f}")
    # Only commd's pods (the DaemonSet's) reach the client port.
    policies = by_kind(docs, "NetworkPolicy")
    if check(len(policies) == 1, "etcd.yaml: expected one NetworkPolicy"):
        p = policies[0]["spec"]
        check(p["podSelector"]["matchLabels"].items() <= labels.items(),
              "the NetworkPolicy does not select the etcd pods")
        commd_labels = ds["spec"]["template"]["metadata"]["labels"]
        to_client = [r for r in p["ingress"] if any(x.get("port") == 2379 for x in r.get("ports", []))]
        check(to_client and all(r.get("from") for r in to_client),
              "the NetworkPolicy opens etcd's client port to every pod")
        check(any(f.get("podSelector", {}).get("matchLabels", {}).items() <= commd_labels.items()
                  for r in to_client for f in r["from"]),
              "the NetworkPolicy does not let commd's pods reach etcd's client port")
    budgets = by_kind(docs, "PodDisruptionBudget")
    if check(len(budgets) == 1, "etcd.yaml: expected one PodDisruptionBudget"):
        check(budgets[0]["spec"].get("minAvailable") == replicas // 2 + 1,
              "the PodDisruptionBudget does not keep a quorum")
    return members


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, pred, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if pred():
                return True
        except Exception:  # not up yet
            pass
        time.sleep(0.1)
    failures.append(f"timed out after {timeout}s waiting for {what}")
    return False


def check_with_real_etcd(commd, config, etcd_docs, commd_command):
    """etcd from the manifest's flags on loopback, then commd as the DaemonSet runs it."""
    c = by_kind(etcd_docs, "StatefulSet")[0]["spec"]["template"]["spec"]["containers"][0]
    flags = flags_of(c["command"])
    tmp = tempfile.mkdtemp(prefix="commd-k8s-")
    procs = []
    try:
        client, peer, metrics = (f"127.0.0.1:{free_port()}" for _ in range(3))
        # One member on loopback: the addresses and the member list are the cluster's own.
        flags.update({"--name": "etcd-0", "--data-dir": os.path.join(tmp, "etcd"),
                      "--listen-client-urls": f"http://{client}",
                      "--advertise-client-urls": f"http://{client}",
                      "--listen-peer-urls": f"http://{peer}",
                      "--initial-advertise-peer-urls": f"http://{peer}",
                      "--initial-cluster": f"etcd-0=http://{peer}",
                      "--listen-metrics-urls": f"http://{metrics}"})
        etcd_log = os.path.join(tmp, "etcd.log")
        procs.append(subprocess.Popen([ETCD] + [f"{k}={v}" for k, v in flags.items()],
                                      stdout=open(etcd_log, "w"), stderr=subprocess.STDOUT))
        if not wait_for("etcd ready on the manifest's flags",
                        lambda: "ready to serve client requests" in open(etcd_log).read(), 60):
            failures.append("etcd log:\n" + open(etcd_log).read()[-3000:])
            return
        probe = c["readinessProbe"]["httpGet"]["path"]
        wait_for(f"etcd's probe GET {probe} on the metrics port",
                 lambda: b'"health":"true"' in urllib.request.urlopen(
                     f"http://{metrics}{probe}", timeout=5).read(), 30)
        # commd as the DaemonSet starts it, $(NODE_NAME) expanded as Kubernetes does, the
        # endpoints pointed at this etcd.
        path = os.path.join(tmp, "commd.textproto")
        with open(path, "w") as f:
            f.write(re.sub(r'(etcd_endpoints:\s*")[^"]+(")', lambda m: m.group(1) + client + m.group(2),
                           config))
        argv = [commd] + [a.replace("$(NODE_NAME)", NODE_NAME) for a in commd_command[1:]]
        argv[argv.index("--config") + 1] = path
        argv += ["--runtime-dir", os.path.join(tmp, "run"), "--metrics-address", "127.0.0.1:0",
                 "--dump-dir", os.path.join(tmp, "dumps")]
        commd_log = os.path.join(tmp, "commd.log")
        procs.append(subprocess.Popen(argv, stdout=open(commd_log, "w"), stderr=subprocess.STDOUT))
        prefix = re.search(r'prefix:\s*"([^"]+)"', config)
        key = f"{prefix.group(1) if prefix else '/commd'}/nodes/{NODE_NAME}"

        def registered():
            out = subprocess.run([ETCDCTL, "--endpoints", client, "get", "--keys-only", key],
                                 capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"))
            return key in out.stdout
        if not wait_for(f"commd registered as {key} in etcd", registered, 60):
            failures.append("commd log:\n" + open(commd_log).read()[-3000:])
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def check_config_with_daemon(commd, config):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "commd.textproto")
        with open(path, "w") as f:
            f.write(config)
        log = open(os.path.join(tmp, "log"), "w+")
        proc = subprocess.Popen(
            [commd, "--config", path, "--runtime-dir", os.path.join(tmp, "run"),
             "--metrics-address", "127.0.0.1:0", "--dump-dir", os.path.join(tmp, "dumps")],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        ready = False
        while time.time() < deadline and proc.poll() is None:
            log.seek(0)
            if "commd ready" in log.read():
                ready = True
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
        log.seek(0)
        check(ready, "commd did not start on the ConfigMap's config:\n" + log.read())


if __name__ == "__main__":
    main()
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("k8s manifests ok")
