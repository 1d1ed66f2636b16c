#!/usr/bin/env python3
"""Compares what CMake and Bazel build, per target: compiled sources and direct dependencies.

scripts/check-build-parity runs it with CMake's <build>/commd_targets.json (written at
generate time by cmake/CommdBazel.cmake: each target's SOURCES and LINK_LIBRARIES as CMake
uses them) and `bazel query --output=xml` of every rule. Both sides are brought to one form:
sources as paths below the workspace (generated ones below the build dir or bazel-bin),
dependencies as CMake target names through cmake/bazel_build_reader.py's one table. Headers
are not compared: CMake does not need them listed. Prints each difference, naming the target.

Usage: build_parity.py CMAKE_BUILD_DIR TARGETS_JSON BAZEL_QUERY_XML
"""

import json
import os
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cmake"))
from bazel_build_reader import label_to_cmake_target  # noqa: E402

COMPILED = (".cc", ".c", ".cpp", ".cu")
CC_RULES = ("cc_library", "cc_binary", "cc_test")
def label_path(label):
    """//pkg:path/f.cc -> pkg/path/f.cc"""
    pkg, _, name = label[2:].partition(":")
    return "/".join(p for p in (pkg, name) if p)


def bazel_targets(xml_path):
    rules = {}
    for rule in ET.parse(xml_path).getroot().iter("rule"):
        attrs = {}
        for lst in rule.findall("list"):
            attrs[lst.get("name")] = [e.get("value") for e in lst.findall("label")]
        for s in rule.findall("string"):
            attrs[s.get("name")] = s.get("value")
        rules[rule.get("name")] = (rule.get("class"), attrs)
    out = {}
    for label, (kind, attrs) in rules.items():
        if kind not in CC_RULES or attrs.get("generator_function") == "commd_proto_library":
            continue
        srcs = set()
        for src in attrs.get("srcs", []):
            if src in rules and rules[src][0] == "cuda_objects":  # its .cu files
                srcs.update(label_path(s) for s in rules[src][1].get("srcs", []))
            else:
                srcs.add(label_path(src))
        deps = {label_to_cmake_target(d, None) or d for d in attrs.get("deps", [])}
        name = label.rpartition(":")[2]
        out[name] = ({s for s in srcs if s.endswith(COMPILED)}, deps, label)
    return out


def cmake_targets(build_dir, json_path):
    root = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    build = os.path.realpath(build_dir)
    out = {}
    for t in json.load(open(json_path)):
        srcs = set()
        for s in filter(None, t["sources"].split("|")):
            s = os.path.realpath(os.path.join(t["source_dir"], s))
            base = build if s.startswith(build + os.sep) else root
            srcs.add(os.path.relpath(s, base))
        deps = set(filter(None, t["link"].split("|")))
        if t["sdk_shared"] in ("TRUE", "ON", "1") and "commd_client" in deps:
            deps = (deps - {"commd_client"}) | {"commd_client_static"}
        out[t["name"]] = ({s for s in srcs if s.endswith(COMPILED)}, deps,
                          t["declared_in"] or "CMakeLists.txt in " +
                          os.path.relpath(t["source_dir"], root))
    return out


def main(argv):
    if len(argv) != 4:
        sys.exit(__doc__)
    cmake = cmake_targets(argv[1], argv[2])
    bazel = bazel_targets(argv[3])
    problems = 0
    for name in sorted(set(cmake) & set(bazel)):
        c_srcs, c_deps, where = cmake[name]
        b_srcs, b_deps, label = bazel[name]
        c_deps = {"dl" if d == "${CMAKE_DL_LIBS}" else d for d in c_deps}
        b_deps = {"dl" if d == "${CMAKE_DL_LIBS}" else d for d in b_deps}
        for what, c, b in (("sources", c_srcs, b_srcs), ("deps", c_deps, b_deps)):
            if c != b:
                if not problems:
                    print("CMake and Bazel targets whose %s differ (declare them once, in "
                          "BUILD.bazel, and create the CMake target with commd_target(NAME), "
                          "cmake/CommdBazel.cmake):" % "sources or dependencies",
                          file=sys.stderr)
                problems += 1
                print("  %s (%s, CMake: %s): %s differ: only in CMake: %s; only in Bazel: %s" %
                      (name, label, where, what, sorted(c - b) or "-", sorted(b - c) or "-"),
                      file=sys.stderr)
    print("sources and deps of %d C++ targets agree" % len(set(cmake) & set(bazel)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
