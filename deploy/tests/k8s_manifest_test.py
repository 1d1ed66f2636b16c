#!/usr/bin/env python3
"""Checks deploy/k8s/commd-daemonset.yaml: valid YAML, and the DaemonSet has what a commd
node daemon needs (hostPath runtime and dump dirs, hostIPC, the NVIDIA devices, probes on
the metrics endpoint, scrape annotations). Then starts the real commd on the ConfigMap's
config (runtime dir, metrics address and dump dir overridden by flags to temporary ones),
so a config the daemon rejects fails here.

Usage: k8s_manifest_test.py MANIFEST COMMD_BINARY
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import yaml

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def main():
    manifest, commd = sys.argv[1], sys.argv[2]
    with open(manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
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
    config = kinds["ConfigMap"]["data"]["commd.textproto"]
    check_config_with_daemon(commd, config)


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
    print("k8s manifest ok")
