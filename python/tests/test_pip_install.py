"""`pip install` of the package as the docs tell users (docs/python.md, "Install"): the build
tree installed as the .deb lays it out (DESTDIR=D cmake --install --prefix /usr), then the
package's source the .deb ships (D/usr/share/commd/python) built by pip against that SDK
into a directory of its own, imported from there (outside the source and build trees) and
used for a real collective on a real daemon.

COMMD_PIP_PYTHON is the python pip runs with (--no-build-isolation: scikit-build-core comes
from its environment, scripts/pybuild-venv or scripts/torch-venv): without torch the package
is the binding alone and the ranks run on Debian's /usr/bin/python3; with torch it has
commd._c10d too and the ranks run under torchrun, backend "commd" through it."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
WORKER = os.path.join(SOURCE, "tests", "pip_worker.py")


def run(args: list[str], env: dict[str, str], cwd: str, timeout: float = 600) -> str:
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, \
        f"{args} failed ({proc.returncode}):\n{proc.stdout[-8000:]}\n{proc.stderr[-8000:]}"
    return proc.stdout


def test_pip_install_builds_against_the_installed_sdk(daemon, tmp_path):
    python = os.environ["COMMD_PIP_PYTHON"]
    build_dir = os.environ["COMMD_BUILD_DIR"]
    root = str(tmp_path)
    for tree in (SOURCE, build_dir):  # the package is imported from neither
        assert os.path.commonpath([root, os.path.realpath(tree)]) != os.path.realpath(tree)
    has_torch = subprocess.run([python, "-c", "import torch"],
                               stderr=subprocess.DEVNULL).returncode == 0
    assert has_torch == (os.environ.get("COMMD_PIP_TORCH") == "1"), python

    # The SDK as the .deb lays it out, under a DESTDIR (the install rules also name /etc).
    dest = os.path.join(root, "dest")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DESTDIR")}
    run([os.environ.get("CMAKE", "cmake"), "--install", build_dir, "--prefix", "/usr"],
        dict(env, DESTDIR=dest), root)
    prefix = os.path.join(dest, "usr")
    assert glob.glob(os.path.join(prefix, "lib", "**", "cmake", "commd", "commdConfig.cmake"),
                     recursive=True)
    # The package's source as the .deb ships it, which users pip-install from.
    package = os.path.join(prefix, "share", "commd", "python")
    assert not glob.glob(os.path.join(prefix, "lib", "python3", "dist-packages", "commd",
                                      "_c10d*"))  # the .deb's binding has no _c10d

    # pip, as a user runs it, with the SDK's prefix on CMake's search path. ccache with the
    # temporary root as its base dir: paths inside it hash alike from run to run.
    site = os.path.join(root, "site")
    pip_env = dict(env, CMAKE_PREFIX_PATH=prefix, CMAKE_BUILD_PARALLEL_LEVEL="2",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
    if shutil.which("ccache"):
        pip_env.update(CMAKE_CXX_COMPILER_LAUNCHER="ccache", CCACHE_BASEDIR=root,
                       CCACHE_NOHASHDIR="true")
    run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-cache-dir",
         "--target", site, f"--config-settings=build-dir={os.path.join(root, 'build')}",
         package], pip_env, root)
    modules = sorted(os.path.basename(p) for p in glob.glob(os.path.join(site, "commd", "*.so")))
    want = ["_c10d", "_commd"] if has_torch else ["_commd"]
    assert [m.split(".")[0] for m in modules] == want, modules

    # Ranks started in the temporary root with only `site` on the path.
    out = os.path.join(root, "out")
    os.mkdir(out)
    run_env = dict(env, PYTHONPATH=site, PYTHONDONTWRITEBYTECODE="1",
                   COMMD_RUNTIME_DIR=daemon.runtime_dir, OMP_NUM_THREADS="1")
    run_env.pop("COMMD_JOB_ID", None)
    if has_torch:
        run([python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
             "--monitor-interval=1", WORKER, "torch", out], dict(run_env, COMMD_TORCH_CPP="1"),
            root, timeout=300)
    else:
        job = "pip-" + uuid.uuid4().hex[:12]
        procs = [subprocess.Popen(["/usr/bin/python3", WORKER, "binding", daemon.runtime_dir,
                                   job, str(r), out], env=run_env, cwd=root,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        for p in procs:
            output = p.communicate(timeout=120)[0]
            assert p.returncode == 0, output
    for rank in range(2):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            r = json.load(f)
        assert r["commd"] == os.path.join(site, "commd", "__init__.py"), r
        if has_torch:
            assert r["c10d"].startswith(os.path.join(site, "commd", "_c10d")), r
            assert r["zero_copy_calls"] == 1, r  # the all_reduce took the C++ path
        else:
            assert r["executable"] == "/usr/bin/python3", r
            assert r["sum"] == 2001.0, r


NOBODY = 65534  # the unprivileged user the install runs as (Debian's `nobody`)


def test_a_user_pip_installs_the_root_owned_read_only_source_into_a_venv_of_their_own():
    """The .deb's /usr/share/commd/python belongs to root and is read-only: a user without
    root builds it into a virtualenv of their own (`python3 -m venv --system-site-packages`,
    Debian's python3 and pip) as docs/python.md tells, with no option about where to build,
    and imports it. Nothing may be written into the source tree (scikit-build-core builds in
    a temporary directory of the user's). Runs as root, switching to uid 65534 (setpriv); the
    user reaches only a world-readable temporary tree (the SDK installed as the .deb lays it
    out, and scikit-build-core copied from COMMD_PIP_PYTHON's environment, since Debian 12
    has no package of it), never /root."""
    if os.geteuid() != 0:
        pytest.skip("needs root: makes a root-owned tree and switches to an unprivileged uid")
    if os.environ.get("COMMD_PIP_TORCH") == "1":
        pytest.skip("runs in python_pip_install_test: the user cannot reach the torch venv")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv (util-linux) to run as another uid")
    python = os.environ["COMMD_PIP_PYTHON"]
    build_dir = os.environ["COMMD_BUILD_DIR"]
    root = tempfile.mkdtemp(prefix="commd-pip-user-")  # not pytest's tmp_path: root's, 0700
    try:
        os.chmod(root, 0o755)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DESTDIR")}
        dest = os.path.join(root, "dest")
        run([os.environ.get("CMAKE", "cmake"), "--install", build_dir, "--prefix", "/usr"],
            dict(env, DESTDIR=dest), root)
        prefix = os.path.join(dest, "usr")
        package = os.path.join(prefix, "share", "commd", "python")
        for d, _, files in os.walk(package):  # as the .deb leaves it: root's, read-only
            for name in files:
                os.chmod(os.path.join(d, name), 0o444)
            os.chmod(d, 0o555)
        before = tree(package)
        assert before and all(uid == 0 for _, uid, _, _ in before)

        # scikit-build-core and what it imports, pure Python, readable by the user.
        tools = os.path.join(root, "tools")
        os.mkdir(tools)
        found = json.loads(run([python, "-c", TOOLS], env, root))
        for path in found:
            copy = shutil.copytree if os.path.isdir(path) else shutil.copy2
            copy(path, os.path.join(tools, os.path.basename(path)))
        home = os.path.join(root, "home")
        os.mkdir(home)
        os.chown(home, NOBODY, NOBODY)

        as_user = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        user_env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
                    "PYTHONPATH": tools, "CMAKE_PREFIX_PATH": prefix,
                    "CMAKE_BUILD_PARALLEL_LEVEL": "2", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                    "PYTHONDONTWRITEBYTECODE": "1"}
        user_env.update(user_ccache(root))
        venv = os.path.join(home, "venv")
        run(as_user + ["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                       "--without-pip", venv], user_env, home)
        run(as_user + [os.path.join(venv, "bin", "python"), "-m", "pip", "install",
                       "--no-build-isolation", "--no-deps", "--no-index", package],
            user_env, home)
        out = run(as_user + [os.path.join(venv, "bin", "python"), "-c", IMPORT],
                  dict(user_env, PYTHONPATH=""), home)
        r = json.loads(out.strip().splitlines()[-1])
        site = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
        assert len(site) == 1, site
        assert r["commd"] == os.path.join(site[0], "commd", "__init__.py"), r
        assert r["binding"].startswith(os.path.join(site[0], "commd", "_commd")), r
        assert r["uid"] == NOBODY and r["client"] == "Client", r
        # The installed files are the user's; the source tree is as it was.
        assert os.stat(r["binding"]).st_uid == NOBODY
        assert tree(package) == before
    finally:
        shutil.rmtree(root, ignore_errors=True)


USER_CCACHE = "/var/tmp/commd-pip-user-ccache"


def user_ccache(root: str) -> dict[str, str]:
    """The environment that gives the unprivileged user's build a compiler cache of their own
    kept between runs (USER_CCACHE, theirs alone, mode 0700), so that a run recompiles only
    what changed, as the other builds of scripts/test do; paths relative to `root`, which
    differs from run to run. Nothing when ccache is missing or the directory is not theirs."""
    ccache = shutil.which("ccache")
    if ccache is None:
        return {}
    if not os.path.isdir(USER_CCACHE):
        os.mkdir(USER_CCACHE, 0o700)
        os.chown(USER_CCACHE, NOBODY, NOBODY)
    st = os.lstat(USER_CCACHE)
    if st.st_uid != NOBODY or st.st_mode & 0o077:
        return {}
    return {"CMAKE_CXX_COMPILER_LAUNCHER": ccache, "CCACHE_DIR": USER_CCACHE,
            "CCACHE_BASEDIR": root, "CCACHE_NOHASHDIR": "true", "CCACHE_MAXSIZE": "1G"}


# Where COMMD_PIP_PYTHON's scikit-build-core and the packages it imports live (their
# dist-info too: pip checks the build requirements' metadata).
TOOLS = """
import glob, importlib, json, os
paths = []
for name in ("scikit_build_core", "packaging", "pathspec"):
    d = os.path.dirname(importlib.import_module(name).__file__)
    paths.append(d)
    paths += glob.glob(os.path.join(os.path.dirname(d), name.replace("_", "[-_]") + "-*.dist-info"))
print(json.dumps(paths))
"""

IMPORT = """
import json, os, commd, commd._commd
print(json.dumps({"commd": commd.__file__, "binding": commd._commd.__file__,
                  "uid": os.getuid(), "client": commd.Client.__name__}))
"""


def tree(top: str) -> list:
    """(path, owner, mode, mtime) of everything under `top`."""
    entries = []
    for d, dirs, files in os.walk(top):
        for name in [""] + files:
            st = os.lstat(os.path.join(d, name))
            entries.append((os.path.join(d, name), st.st_uid, st.st_mode, st.st_mtime_ns))
    return sorted(entries)
