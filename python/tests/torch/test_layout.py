"""The Python package's shape, as a newcomer would check it: no import cycle among the
modules of `commd` (commd.torch's included), each module importable first in a fresh
interpreter, no module or binding source over 500 lines, and every module of the package
installed (python/CMakeLists.txt's COMMD_PYTHON_FILES) and every binding source built. No
daemon needed."""

from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

PYTHON_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKAGE_DIR = os.path.join(PYTHON_DIR, "commd")
MAX_LINES = 500


def _modules() -> dict[str, str]:
    """Dotted name -> path of every .py of the package (a package is its __init__)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(PACKAGE_DIR, "**", "*.py"), recursive=True)):
        parts = os.path.relpath(path, PYTHON_DIR)[:-len(".py")].split(os.sep)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _import_time_nodes(body: list[ast.stmt]):
    """The import statements that run when the module is imported: module level, in classes,
    try/if blocks; not in functions (those import when called)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _import_time_nodes(getattr(node, field, []) or [])


def _imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package's modules that `name` imports when it is imported."""
    is_package = path.endswith("__init__.py")
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(open(path).read(), path)
    found = set()
    for node in _import_time_nodes(tree.body):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from X import y`: y is a submodule of X, or a name X's __init__ defines.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        found.update(t for t in targets if t in modules and t != name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated), else None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_package_has_no_import_cycle():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    assert "commd.torch._staging" in modules, sorted(modules)  # the walk saw the package
    assert graph["commd.torch"] >= {"commd.torch._backend", "commd.torch._fused"}, graph
    # The check finds the cycle this package had (commd.torch <-> commd._fused).
    assert _cycle({"commd.torch": {"commd._fused"}, "commd._fused": {"commd.torch"}})


@pytest.mark.parametrize("module", sorted(_modules()))
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    """Imported before anything else of the package: a cycle makes some module meet another
    one half-initialized here (ImportError), whichever is imported first."""
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_no_module_is_over_500_lines():
    files = sorted(glob.glob(os.path.join(PACKAGE_DIR, "**", "*.py"), recursive=True) +
                   glob.glob(os.path.join(PYTHON_DIR, "src", "*.cc")) +
                   glob.glob(os.path.join(PYTHON_DIR, "src", "*.h")))
    assert len(files) > 10, files
    long = {os.path.relpath(f, PYTHON_DIR): n for f in files
            if (n := sum(1 for _ in open(f))) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_every_module_is_installed():
    cmake = open(os.path.join(PYTHON_DIR, "CMakeLists.txt")).read()
    listed = re.search(r"set\(COMMD_PYTHON_FILES([^)]*)\)", cmake).group(1).split()
    on_disk = [os.path.relpath(p, PYTHON_DIR) for p in _modules().values()]
    missing = sorted(set(on_disk) - set(listed))
    assert not missing, f"not in COMMD_PYTHON_FILES (python/CMakeLists.txt): {missing}"


def test_every_binding_source_is_built():
    cmake = open(os.path.join(PYTHON_DIR, "CMakeLists.txt")).read()
    built = set(re.search(r"pybind11_add_module\(commd_python MODULE([^)]*)\)", cmake)
                .group(1).split())
    built |= set(re.search(r"add_library\(commd_c10d MODULE([^)]*)\)", cmake).group(1).split())
    sources = {os.path.relpath(p, PYTHON_DIR)
               for p in glob.glob(os.path.join(PYTHON_DIR, "src", "*.cc"))}
    assert sources <= built, f"not built (python/CMakeLists.txt): {sorted(sources - built)}"
