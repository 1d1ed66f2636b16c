"""commd_proto_library: C++ (and gRPC stubs) from .proto files with the system's protoc.

The Bazel twin of cmake/CommdProto.cmake: runs /usr/bin/protoc and grpc_cpp_plugin (Debian's,
matching the libprotobuf and libgrpc++ the code links) instead of building protobuf from
source. Files under `root` (relative to the package) are imported by their path below it.
"""

def commd_proto_library(name, srcs, root = "", grpc = False, deps = [], visibility = None):
    prefix = (root + "/") if root else ""
    stems = []
    for src in srcs:
        if not src.startswith(prefix) or not src.endswith(".proto"):
            fail("%s: %s is not a .proto file under %s" % (name, src, root or "the package"))
        stems.append(src[:-len(".proto")])
    suffixes = [".pb.cc", ".pb.h"] + ([".grpc.pb.cc", ".grpc.pb.h"] if grpc else [])
    outs = [stem + suffix for stem in stems for suffix in suffixes]
    package = native.package_name()
    proto_path = "/".join([p for p in [package, root] if p]) or "."
    out_dir = "$(RULEDIR)" + ("/" + root if root else "")
    cmd = "protoc --proto_path=%s --cpp_out=%s" % (proto_path, out_dir)
    if grpc:
        cmd += " --grpc_out=%s --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)" % out_dir
    cmd += " $(SRCS)"
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs,
        cmd = cmd,
        message = "protoc " + name,
        tags = ["bazel_only"],
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = [root or "."],
        copts = ["-w"],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc++"] if grpc else []),
        visibility = visibility,
    )
