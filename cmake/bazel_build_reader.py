#!/usr/bin/env python3
"""Reads a folder's BUILD.bazel for CMake: the one declaration of each target's sources and deps.

A BUILD file is Starlark, which for what commd writes (calls with keyword arguments, lists,
list comprehensions, `x if c else y`) is also Python: it is run here with stub functions that
record each cc_library/cc_binary/cc_test instead of building it. The result is one .cmake file
of set() calls that cmake/CommdBazel.cmake's commd_target(NAME) reads to create the target.

Labels become CMake names: //pkg:name and :name are the CMake target of the same name,
@system//:x and @local_cuda//:x go through LABEL_TO_CMAKE, source files become absolute paths
(a genrule's outputs: the folder's build dir, where CMake's custom command writes them).
Whatever the reader does not know fails with the BUILD file's path and line.

Usage: bazel_build_reader.py SOURCE_DIR PACKAGE BINARY_DIR HAVE_CUDA(ON|OFF) OUTPUT.cmake
"""

import builtins
import glob as globlib
import os
import sys

# The one table from Bazel's external labels to CMake's imported targets
# (bazel/system_libs.bzl and bazel/cuda.bzl on one side, cmake/CommdDependencies.cmake and
# cmake/CommdCuda.cmake on the other).
LABEL_TO_CMAKE = {
    "@system//:absl_flat_hash_map": "absl::flat_hash_map",
    "@system//:absl_inlined_vector": "absl::inlined_vector",
    "@system//:absl_span": "absl::span",
    "@system//:absl_status": "absl::status",
    "@system//:absl_statusor": "absl::statusor",
    "@system//:absl_str_format": "absl::str_format",
    "@system//:absl_strings": "absl::strings",
    "@system//:absl_synchronization": "absl::synchronization",
    "@system//:absl_time": "absl::time",
    "@system//:benchmark": "benchmark::benchmark",
    "@system//:dl": "${CMAKE_DL_LIBS}",
    "@system//:gloo": "gloo",
    "@system//:gmock": "GTest::gmock",
    "@system//:grpc++": "gRPC::grpc++",
    "@system//:gtest": "GTest::gtest",
    "@system//:gtest_main": "GTest::gtest_main",
    "@system//:hwloc": "PkgConfig::HWLOC",
    "@system//:mpi": "MPI::MPI_CXX",
    "@system//:libsystemd": "PkgConfig::SYSTEMD",
    "@system//:nlohmann_json": "nlohmann_json::nlohmann_json",
    "@system//:openblas": "PkgConfig::OPENBLAS",
    "@system//:prometheus-cpp-core": "prometheus-cpp::core",
    "@system//:prometheus-cpp-pull": "prometheus-cpp::pull",
    "@system//:protobuf": "protobuf::libprotobuf",
    "@system//:threads": "Threads::Threads",
    "@local_cuda//:cuda_headers": "CUDA::toolkit",
    "@local_cuda//:cudart_static": "CUDA::cudart_static",
}

CMAKE_TO_LABEL = {v: k for k, v in LABEL_TO_CMAKE.items()}
CMAKE_TO_LABEL["dl"] = "@system//:dl"  # ${CMAKE_DL_LIBS} as CMake expands it

# Attributes CMake takes from the BUILD file, and those it leaves to CMakeLists.txt because
# they are about Bazel's runfiles or CMake says them its own way (compile flags, defines,
# test properties, data dependencies).
_READ = {"name", "srcs", "hdrs", "deps", "includes", "strip_include_prefix", "linkshared",
         "testonly"}
_CMAKE_SPECIFIC = {"visibility", "copts", "defines", "local_defines", "data", "linkopts",
                   "tags", "size", "shard_count", "features", "additional_linker_inputs",
                   "args", "timeout", "flaky", "linkstatic", "alwayslink", "env"}


_STARLARK_BUILTINS = ("len", "sorted", "range", "enumerate", "zip", "dict", "list",
                      "str", "int", "bool", "any", "all", "min", "max", "reversed",
                      "hasattr", "getattr", "type", "print")


class BuildFileError(Exception):
    pass


def label_to_cmake_target(label, package):
    """//pkg:name, //pkg (name = last folder) or :name -> name; external labels by the table."""
    if label.startswith("@"):
        return LABEL_TO_CMAKE.get(label)
    if label.startswith(":"):
        return label[1:]
    if label.startswith("//"):
        pkg, _, name = label[2:].partition(":")
        return name or pkg.rsplit("/", 1)[-1]
    return label


class Package:
    def __init__(self, source_dir, package, binary_dir, have_cuda):
        self.source_dir = source_dir
        self.package = package
        self.binary_dir = binary_dir
        self.have_cuda = have_cuda
        self.path = os.path.join(source_dir, package, "BUILD.bazel")
        self.rules = {}  # name -> (kind, attrs, line)
        self.order = []

    def line(self):
        """The line of the BUILD file that is running (for error messages)."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != self.path:
            frame = frame.f_back
        return frame.f_lineno if frame is not None else 0

    def fail(self, line, message):
        raise BuildFileError("%s:%d: %s" % (self.path, line, message))

    def rule(self, kind, read):
        def record(**attrs):
            line = self.line()
            if "name" not in attrs:
                self.fail(line, "%s() without a name" % kind)
            for key in attrs:
                if read and key not in _READ and key not in _CMAKE_SPECIFIC:
                    self.fail(line, "%s(name = %r): attribute %r is not understood by "
                              "cmake/bazel_build_reader.py (add it there, to what CMake reads "
                              "or to what CMakeLists.txt says itself)" %
                              (kind, attrs["name"], key))
            if attrs["name"] in self.rules:
                self.fail(line, "a second target named %r" % attrs["name"])
            self.rules[attrs["name"]] = (kind, attrs, line)
            self.order.append(attrs["name"])
        return record

    def glob(self, include, exclude=[], **_):
        base = os.path.join(self.source_dir, self.package)
        found = set()
        for pattern in include:
            for f in globlib.glob(os.path.join(base, pattern), recursive=True):
                if os.path.isfile(f):
                    found.add(os.path.relpath(f, base))
        for pattern in exclude:
            for f in globlib.glob(os.path.join(base, pattern), recursive=True):
                found.discard(os.path.relpath(f, base))
        return sorted(found)

    def load(self, scope):
        def load(module, *names, **aliases):
            line = self.line()
            values = {
                "@local_cuda//:defs.bzl": {"HAVE_CUDA": self.have_cuda, "NVCC": "nvcc"},
                "//bazel:cuda.bzl": {"cuda_objects": self.rule("cuda_objects", False)},
                # Protos stay with CMake's own commd_proto_library (cmake/CommdProto.cmake).
                "//bazel:proto.bzl": {"commd_proto_library": self.rule("proto", False)},
            }.get(module)
            if values is None:
                self.fail(line, "load(%r) is not known to cmake/bazel_build_reader.py" % module)
            for local, exported in list(zip(names, names)) + list(aliases.items()):
                if exported not in values:
                    self.fail(line, "%s has no %r for cmake/bazel_build_reader.py" %
                              (module, exported))
                scope[local] = values[exported]
        return load

    def select(self, conditions, **_):
        line = self.line()
        if "//conditions:default" not in conditions:
            self.fail(line, "select() without //conditions:default")
        return conditions["//conditions:default"]

    def evaluate(self):
        # Starlark's built-in functions (Python's of the same name behave alike here).
        scope = {"__builtins__": {k: getattr(builtins, k) for k in _STARLARK_BUILTINS}}
        scope.update({
            "cc_library": self.rule("cc_library", True),
            "cc_binary": self.rule("cc_binary", True),
            "cc_test": self.rule("cc_test", True),
            "sh_test": self.rule("sh_test", False),
            "genrule": self.rule("genrule", False),
            "filegroup": self.rule("filegroup", False),
            "exports_files": lambda *a, **k: None,
            "package": lambda **k: None,
            "glob": self.glob,
            "select": self.select,
            "fail": lambda msg, *a: self.fail(self.line(), str(msg)),
        })
        scope["load"] = self.load(scope)
        with open(self.path) as f:
            text = f.read()
        try:
            code = compile(text, self.path, "exec")
            exec(code, scope)
        except BuildFileError:
            raise
        except SyntaxError as e:
            raise BuildFileError("%s:%s: not understood by cmake/bazel_build_reader.py: %s" %
                                 (self.path, e.lineno, e.msg))
        except Exception as e:
            tb = e.__traceback__
            line = 0
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == self.path:
                    line = tb.tb_lineno
                tb = tb.tb_next
            raise BuildFileError("%s:%d: not understood by cmake/bazel_build_reader.py: %s: %s"
                                 % (self.path, line, type(e).__name__, e))

    def source(self, label, line, owner):
        """A srcs/hdrs entry -> absolute paths (a rule of this package -> its files)."""
        if label.startswith(":") or (label.startswith("//") and ":" not in label):
            name = label_to_cmake_target(label, self.package)
            rule = self.rules.get(name)
            if rule is None:
                self.fail(line, "%s: %s names no rule of this package" % (owner, label))
            kind, attrs, rule_line = rule
            if kind == "genrule":
                return [os.path.join(self.binary_dir, o) for o in attrs.get("outs", [])]
            if kind in ("cuda_objects", "filegroup"):
                return [p for s in attrs.get("srcs", []) for p in self.source(s, rule_line, name)]
            self.fail(line, "%s: %s (a %s) cannot be a source for CMake" % (owner, label, kind))
        if label.startswith("@"):
            self.fail(line, "%s: external source %s is not known to CMake" % (owner, label))
        if label.startswith("//"):
            pkg, _, path = label[2:].partition(":")
            return [os.path.join(self.source_dir, pkg, path)]
        for kind, attrs, _ in self.rules.values():
            if kind == "genrule" and label in attrs.get("outs", []):
                return [os.path.join(self.binary_dir, label)]
        return [os.path.join(self.source_dir, self.package, label)]

    def dep(self, label, line, owner):
        target = label_to_cmake_target(label, self.package)
        if target is None:
            self.fail(line, "%s: dependency %s has no CMake target in LABEL_TO_CMAKE "
                      "(cmake/bazel_build_reader.py)" % (owner, label))
        return target

    def targets(self):
        """(name, kind, srcs, hdrs, deps, includes, linkshared, testonly, line) per C++ rule."""
        for name in self.order:
            kind, attrs, line = self.rules[name]
            if kind not in ("cc_library", "cc_binary", "cc_test"):
                continue
            srcs = [p for s in attrs.get("srcs", []) for p in self.source(s, line, name)]
            hdrs = [p for s in attrs.get("hdrs", []) for p in self.source(s, line, name)]
            deps = [self.dep(d, line, name) for d in attrs.get("deps", [])]
            includes = list(attrs.get("includes", []))
            if attrs.get("strip_include_prefix"):
                includes.append(attrs["strip_include_prefix"])
            includes = [os.path.join(self.source_dir, self.package, i) for i in includes]
            yield (name, kind, srcs, hdrs, deps, includes, bool(attrs.get("linkshared")),
                   bool(attrs.get("testonly")), line)


def cmake_list(items):
    return '"%s"' % ";".join(i.replace("\\", "\\\\").replace('"', '\\"') for i in items)


def main(argv):
    if len(argv) != 6:
        sys.exit(__doc__)
    source_dir, package, binary_dir, have_cuda, output = argv[1:]
    pkg = Package(os.path.abspath(source_dir), package, binary_dir,
                  have_cuda.upper() in ("ON", "TRUE", "1", "YES"))
    try:
        pkg.evaluate()
        targets = list(pkg.targets())
    except BuildFileError as e:
        sys.stderr.write("%s\n" % e)
        return 1
    lines = ["# Generated from %s by cmake/bazel_build_reader.py; do not edit." % pkg.path]
    for name, kind, srcs, hdrs, deps, includes, linkshared, testonly, line in targets:
        prefix = "COMMD_BAZEL_%s_" % name
        lines.append("set(%sKIND %s)" % (prefix, kind))
        lines.append("set(%sWHERE %s)" % (prefix, cmake_list(["%s/BUILD.bazel:%d" % (package, line)])))
        lines.append("set(%sSRCS %s)" % (prefix, cmake_list(srcs)))
        lines.append("set(%sHDRS %s)" % (prefix, cmake_list(hdrs)))
        lines.append("set(%sDEPS %s)" % (prefix, cmake_list(deps)))
        lines.append("set(%sINCLUDES %s)" % (prefix, cmake_list(includes)))
        lines.append("set(%sLINKSHARED %s)" % (prefix, "ON" if linkshared else "OFF"))
        lines.append("set(%sTESTONLY %s)" % (prefix, "ON" if testonly else "OFF"))
    text = "\n".join(lines) + "\n"
    old = open(output).read() if os.path.exists(output) else None
    if old != text:  # unchanged output keeps its timestamp
        os.makedirs(os.path.dirname(output), exist_ok=True)
        with open(output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
