#!/usr/bin/env bash
# Checks deploy/commd.service with `systemd-analyze verify`, which must print nothing: an
# unknown key or a bad value is only a warning there, and a warning here is a failure.
# ExecStart points at the built binary, since verify requires the executable to exist.
# Usage: unit_verify_test.sh UNIT COMMD_BINARY
set -euo pipefail
unit=$1
binary=$2
command -v systemd-analyze >/dev/null || { echo "systemd-analyze missing (package systemd)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s#^ExecStart=/usr/bin/commd #ExecStart=${binary} #" "$unit" > "$tmp/commd.service"
grep -q "^ExecStart=${binary} " "$tmp/commd.service" || { echo "no ExecStart=/usr/bin/commd line"; exit 1; }
out=$(cd "$tmp" && systemd-analyze verify --man=no "$tmp/commd.service" 2>&1) || {
  echo "systemd-analyze verify failed:"; echo "$out"; exit 1; }
if [ -n "$out" ]; then
  echo "systemd-analyze verify warned:"; echo "$out"; exit 1
fi
# The hardening as systemd scores it (0 best .. 10 worst; the threshold is in tenths): 3.2
# today; fail when an edit makes it worse than 4.0.
security=$(cd "$tmp" && systemd-analyze security --offline=true --threshold=40 --no-pager \
  "$tmp/commd.service" 2>&1) || { echo "$security" | tail -30; echo "exposure above 4.0"; exit 1; }
echo "$security" | tail -1
# What the unit must have (issue #7), so that a later edit cannot quietly drop it.
for line in Type=notify WatchdogSec= Restart=on-failure RuntimeDirectory=commd \
    RuntimeDirectoryMode=0750 StateDirectory=commd Group=commd NoNewPrivileges=yes \
    ProtectSystem=strict ProtectHome=yes PrivateTmp=yes ReadWritePaths=/var/lib/commd \
    "DeviceAllow=/dev/nvidiactl" "DeviceAllow=char-nvidia-frontend" CapabilityBoundingSet=; do
  grep -q "^${line}" "$unit" || { echo "commd.service lacks ${line}"; exit 1; }
done
if grep -q '^PrivateDevices=yes' "$unit"; then
  echo "PrivateDevices=yes would hide /dev/nvidia*"; exit 1
fi
echo "commd.service verified"
