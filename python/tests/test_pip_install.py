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
