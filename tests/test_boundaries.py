"""The server package never imports the hook package, and the hook never imports the server.

A training machine installs the hook alone; a server installs no torch. Checked twice: every
import statement of every module (ast), and a process that imports every server module and then
finds no `gradwatch` in `sys.modules`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.server import REPO

pytestmark = pytest.mark.unit

PACKAGES = {"gradwatch_server": REPO / "backend" / "gradwatch_server", "gradwatch": REPO / "trainer_hook" / "gradwatch"}


def imported_names(path: Path) -> set[str]:
    """Every module an import statement (or a literal `import_module`/`__import__` call) names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) == "__import__")
        ):
            names.add(node.args[0].value)
    return names


@pytest.mark.parametrize("package, other", [("gradwatch_server", "gradwatch"), ("gradwatch", "gradwatch_server")])
def test_no_module_imports_the_other_package(package: str, other: str) -> None:
    modules = sorted(PACKAGES[package].rglob("*.py"))
    assert len(modules) > 10
    offenders = {
        str(m.relative_to(REPO)): sorted(n for n in imported_names(m) if n.split(".")[0] == other) for m in modules
    }
    assert {m: names for m, names in offenders.items() if names} == {}


def test_the_checker_sees_each_form_of_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import gradwatch.spool\nfrom gradwatch import wire\nfrom . import local\n"
        "import importlib\nimportlib.import_module('gradwatch')\n__import__('gradwatch.x')\n"
        "importlib.util.find_spec('gradwatch')\n"
    )
    assert imported_names(source) == {"gradwatch.spool", "gradwatch", "importlib", "gradwatch.x"}


IMPORT_ALL = """
import importlib, json, pkgutil, sys
import gradwatch_server
names = [m.name for m in pkgutil.walk_packages(gradwatch_server.__path__, "gradwatch_server.")
         if not m.name.startswith("gradwatch_server.migrations") and m.name != "gradwatch_server.__main__"]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "hook": sorted(n for n in sys.modules if n.split(".")[0] == "gradwatch")}))
"""


def test_importing_every_server_module_loads_no_hook_module() -> None:
    """Left out: the migrations (alembic runs them; their env.py needs alembic's context) and
    `__main__` (importing it runs the command); the ast test covers them."""
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert "gradwatch_server.cli" in result["imported"] and len(result["imported"]) > 20
    assert result["hook"] == []


#: Inside the server, what a package must not import (docs/development.md, "The repository"): the
#: store is below everything that serves, the diagnostics and a job's assembly below the routes and
#: the connections that feed them.
NEVER = {
    "store": {"api", "ingest", "live", "diagnostics", "app"},
    "jobs": {"api", "ingest", "app"},
    "diagnostics": {"api", "ingest", "live", "app"},
}


def server_imports(path: Path) -> set[str]:
    """The server's top-level modules or packages that a server module imports (relative imports)."""
    package = PACKAGES["gradwatch_server"]
    here = list(path.relative_to(package).parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            target = base + (node.module.split(".") if node.module else [])
            found.update([target[0]] if target else [alias.name for alias in node.names])
    return found


@pytest.mark.parametrize("inner", sorted(NEVER))
def test_a_server_package_imports_only_what_the_map_allows(inner: str) -> None:
    modules = sorted((PACKAGES["gradwatch_server"] / inner).rglob("*.py"))
    assert modules
    offenders = {str(m.relative_to(REPO)): sorted(server_imports(m) & NEVER[inner]) for m in modules}
    assert {m: names for m, names in offenders.items() if names} == {}
