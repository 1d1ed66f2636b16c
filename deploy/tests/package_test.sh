#!/usr/bin/env bash
# Builds the .deb with CPack from a finished build dir, unpacks it into a throwaway root
# (dpkg -x) and checks it: its files, its control data and maintainer scripts, and the SDK
# as a trainer uses it: a small program built against the unpacked tree with
# find_package(commd) and with pkg-config, run against the unpacked commd daemon.
# Usage: package_test.sh BUILD_DIR CPACK VERSION
set -euo pipefail  # so pipelines end in a plain grep, never grep -q (SIGPIPE would fail them)
build=$1
cpack=$2
version=$3
tmp=$(mktemp -d)
daemon_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

(cd "$build" && "$cpack" -G DEB -B "$tmp/out" --config "$build/CPackConfig.cmake" >"$tmp/cpack.log" 2>&1) ||
  { cat "$tmp/cpack.log"; fail "cpack failed"; }
deb=$(ls "$tmp"/out/commd_"${version}"_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || { ls -R "$tmp/out"; fail "no commd_${version}_*.deb"; }
echo "package: $(basename "$deb"), $(stat -c %s "$deb") bytes"

root=$tmp/root
dpkg -x "$deb" "$root"
dpkg-deb -e "$deb" "$tmp/control"

# Files.
libdir=$(cd "$root/usr" && dirname "$(find . -name 'libcommd_client.so.0' | head -1)")
libdir=${libdir#./}
[ "$libdir" != "." ] || fail "no libcommd_client.so.0 in the package"
for f in usr/bin/commd usr/bin/commctl usr/$libdir/libcommd_client.so usr/$libdir/libcommd_client.so.0 \
    usr/$libdir/libcommd_client.so."$version" usr/$libdir/cmake/commd/commdConfig.cmake \
    usr/$libdir/cmake/commd/commdConfigVersion.cmake usr/$libdir/pkgconfig/commd.pc \
    usr/include/commd/commd.h usr/include/commd/group.h usr/include/commd/v1/topology.pb.h \
    usr/include/commd/v1/node.pb.h usr/lib/systemd/system/commd.service etc/commd/commd.textproto \
    usr/share/commd/prometheus/commd.rules.yml usr/share/commd/prometheus/prometheus.yml \
    usr/share/commd/k8s/commd-daemonset.yaml usr/share/commd/k8s/etcd.yaml usr/share/doc/commd/operations.md; do
  [ -e "$root/$f" ] || fail "package lacks /$f"
done
[ "$(ls "$root"/usr/share/commd/dashboards/*.json | wc -l)" -ge 2 ] || fail "package lacks the dashboards"
if find "$root" -name '*.grpc.pb.h' | grep . >/dev/null; then fail "package carries gRPC stub headers"; fi
if find "$root" -path '*include*' -name '*.h' | xargs grep -l '"common/\|"daemon/' | grep . >/dev/null; then
  fail "an installed header includes a private one"
fi
cmp -s "$root/etc/commd/commd.textproto" "$(dirname "$0")/../commd.textproto" ||
  fail "/etc/commd/commd.textproto is not deploy/commd.textproto"
file "$root/usr/bin/commd" | grep 'not stripped' >/dev/null && fail "commd is not stripped"

# Control data and maintainer scripts: the config is a conffile, the group is created, and
# nothing is enabled or started.
grep -qx /etc/commd/commd.textproto "$tmp/control/conffiles" || fail "commd.textproto is not a conffile"
grep -q 'groupadd --system commd' "$tmp/control/postinst" || fail "postinst does not create the commd group"
for s in postinst prerm postrm; do
  [ -x "$tmp/control/$s" ] || fail "$s missing or not executable"
  sh -n "$tmp/control/$s" || fail "$s is not valid sh"
  if grep -v '^ *#' "$tmp/control/$s" | grep -Eq 'systemctl (enable|start|restart)|deb-systemd-helper enable|invoke-rc.d'; then
    fail "$s enables or starts something"
  fi
done
grep -q '^Depends:.*libprotobuf' "$tmp/control/control" || fail "Depends lacks the protobuf runtime"

# The maintainer scripts' logic, with the system tools they call replaced by recorders (they
# must not touch this machine's groups or services): postinst creates the group only when it
# is missing, and nothing ever enables or starts the unit.
mkdir -p "$tmp/fakebin"
for tool in groupadd systemctl; do
  printf '#!/bin/sh\necho "%s $*" >>"%s/calls"\n' "$tool" "$tmp" >"$tmp/fakebin/$tool"
done
printf '#!/bin/sh\n[ -n "$GROUP_EXISTS" ]\n' >"$tmp/fakebin/getent"
chmod +x "$tmp/fakebin/"*
PATH="$tmp/fakebin:$PATH" sh "$tmp/control/postinst" configure || fail "postinst configure failed"
grep -qx 'groupadd --system commd' "$tmp/calls" || fail "postinst did not run groupadd --system commd"
: >"$tmp/calls"
GROUP_EXISTS=1 PATH="$tmp/fakebin:$PATH" sh "$tmp/control/postinst" configure || fail "postinst configure failed"
if grep -q groupadd "$tmp/calls"; then fail "postinst re-created an existing group"; fi
PATH="$tmp/fakebin:$PATH" sh "$tmp/control/prerm" upgrade || fail "prerm upgrade failed"
PATH="$tmp/fakebin:$PATH" sh "$tmp/control/postrm" remove || fail "postrm remove failed"
if grep -Eq 'systemctl.*(enable|start|restart)' "$tmp/calls"; then
  fail "a maintainer script enabled or started commd: $(cat "$tmp/calls")"
fi
"$root/usr/bin/commd" --version | grep "$version" >/dev/null || fail "commd --version does not say $version"

# A trainer's build against the unpacked SDK.
mkdir -p "$tmp/app"
cat >"$tmp/app/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(commd_consumer CXX)
find_package(commd 0.1 REQUIRED)
add_executable(consumer main.cc)
target_link_libraries(consumer PRIVATE commd::client)
CMAKE
cat >"$tmp/app/main.cc" <<'CC'
#include <cstdio>
#include <commd/commd.h>
int main() {
  auto client = commd::Client::Connect();
  if (!client.ok()) { std::fprintf(stderr, "%s\n", client.status().ToString().c_str()); return 1; }
  auto status = (*client)->GetStatus();
  if (!status.ok()) { std::fprintf(stderr, "%s\n", status.status().ToString().c_str()); return 1; }
  std::printf("connected to commd %s\n", status->version().c_str());
  return 0;
}
CC
cmake -S "$tmp/app" -B "$tmp/app/build" -G Ninja -DCMAKE_PREFIX_PATH="$root/usr" >"$tmp/app.log" 2>&1 &&
  cmake --build "$tmp/app/build" >>"$tmp/app.log" 2>&1 || { cat "$tmp/app.log"; fail "find_package(commd) build failed"; }
ldd "$tmp/app/build/consumer" | grep "$root/usr/$libdir/libcommd_client.so.0" >/dev/null ||
  { ldd "$tmp/app/build/consumer"; fail "consumer does not load the unpacked libcommd_client"; }
PKG_CONFIG_PATH="$root/usr/$libdir/pkgconfig" pkg-config --modversion commd | grep -x "$version" >/dev/null ||
  fail "pkg-config commd --modversion is not $version"
# shellcheck disable=SC2046
c++ -o "$tmp/app/consumer_pc" "$tmp/app/main.cc" $(PKG_CONFIG_PATH="$root/usr/$libdir/pkgconfig" pkg-config --cflags --libs commd) \
  -Wl,-rpath,"$root/usr/$libdir" 2>"$tmp/pc.log" || { cat "$tmp/pc.log"; fail "pkg-config build failed"; }

# Both run against the unpacked daemon.
"$root/usr/bin/commd" --runtime-dir "$tmp/run" --metrics-address 127.0.0.1:0 --dump-dir "$tmp/dumps" \
  >"$tmp/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do grep -q 'commd ready' "$tmp/daemon.log" && break; sleep 0.05; done
grep -q 'commd ready' "$tmp/daemon.log" || { cat "$tmp/daemon.log"; fail "unpacked commd did not start"; }
for app in consumer consumer_pc; do
  bin=$tmp/app/build/consumer; [ $app = consumer_pc ] && bin=$tmp/app/consumer_pc
  out=$(COMMD_RUNTIME_DIR="$tmp/run" "$bin" 2>&1) || fail "$app: $out"
  [ "$out" = "connected to commd $version" ] || fail "$app printed: $out"
done
"$root/usr/bin/commctl" --runtime-dir "$tmp/run" status | grep "$version" >/dev/null || fail "unpacked commctl status"
# The Python binding for Debian's python3 (built when pybind11-dev is there: COMMD_PYTHON=AUTO).
pydir=$root/usr/lib/python3/dist-packages
if [ -e /usr/lib/cmake/pybind11/pybind11Config.cmake ] || [ -d "$pydir/commd" ]; then
  for f in __init__.py errors.py _commd.pyi py.typed; do
    [ -e "$pydir/commd/$f" ] || fail "package lacks python3 commd/$f"
  done
  ls "$pydir"/commd/_commd.cpython-*.so >/dev/null 2>&1 || fail "package lacks the commd._commd module"
  out=$(cd "$tmp" && COMMD_RUNTIME_DIR="$tmp/run" PYTHONPATH="$pydir" LD_LIBRARY_PATH="$root/usr/$libdir" \
    /usr/bin/python3 -c 'import commd; print("connected to commd", commd.Client.connect().status()["version"])' 2>&1) ||
    fail "python3 -c 'import commd': $out"
  [ "$out" = "connected to commd $version" ] || fail "python3 commd printed: $out"
  # No commd._c10d (built against one torch wheel, docs/python.md); the package's source for
  # `pip install` from the installed SDK instead (python_pip_install_test builds it).
  ! ls "$pydir"/commd/_c10d* >/dev/null 2>&1 || fail "package ships commd._c10d"
  for f in pyproject.toml CMakeLists.txt commd/torch/__init__.py commd/torch/_staging.py src/c10d.cc \
           src/binding.cc; do
    [ -e "$root/usr/share/commd/python/$f" ] || fail "package lacks share/commd/python/$f"
  done
fi
kill "$daemon_pid"; wait "$daemon_pid" || fail "commd did not exit 0 on SIGTERM"; daemon_pid=""
echo "package ok"
