"""The tiers of the tests: which slow part a test needs, declared where a reader sees it.

Each test module is of exactly one tier, declared in the module (`pytestmark = pytest.mark.unit`)
or, for a folder whose every test is of one tier, in that folder's conftest.py
(`pytest_itemcollected = folder_tier("browser")`):

- `unit`: runs in this process: the hook, the server's code (its app in process), the CLIs;
- `server`: starts a real `gradwatch serve` process;
- `browser`: drives a real Chromium (tests/browser);
- `corpus`: runs the diagnostics corpus, a training script per process (tests/diagnostics);
- `integration`: whole runs against servers that fail on purpose (tests/integration); a module
  of them whose assertions time something also carries the `timed` marker (run alone).

A test of a `unit` module that starts a server carries `@pytest.mark.server` itself. Whatever the
tier, a test on PostgreSQL (the `postgresql` variant of the `db_url` fixtures, or the `postgres`
fixture) also gets the `postgres` marker from tests/conftest.py. `make test-fast` leaves out every
test marked browser, postgres, server, corpus or integration. A test that starts a server without
being of a tier that may (`SERVERS`) fails at once and says which marker it lacks
(`refuse_servers`, set by tests/conftest.py for each test; tests/test_tiers.py checks both rules).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

#: The tiers, one per test module.
TIERS = ("unit", "server", "browser", "corpus", "integration")
#: The tiers whose tests may start a `gradwatch serve`.
SERVERS = frozenset({"server", "browser", "corpus", "integration"})

#: Why the running test may not start a server ("" while it may, or outside pytest).
refuse_servers = ""


def folder_tier(tier: str) -> Callable[[pytest.Item], None]:
    """The `pytest_itemcollected` hook of a folder's conftest.py that puts every test under the
    folder in `tier` (pytest calls a conftest's collection hooks for the items under it only)."""
    assert tier in TIERS, tier

    def pytest_itemcollected(item: pytest.Item) -> None:
        item.add_marker(tier)

    return pytest_itemcollected


#: The text by which `make test` finds the modules of its timed tier (Makefile: TIMED_MODULES).
TIMED_TEXT = "mark.timed"


def timed_outside_their_tier(items: list[pytest.Item]) -> list[str]:
    """The `timed` tests whose module's text does not say TIMED_TEXT: `make test`'s timed tier,
    which collects only the modules that do, would leave them out (and its parallel tier leaves
    out every `timed` test)."""
    says: dict[Path, bool] = {}
    missing = []
    for item in items:
        if item.get_closest_marker("timed") is None:
            continue
        module = Path(str(item.path))
        if module not in says:
            says[module] = TIMED_TEXT in module.read_text()
        if not says[module]:
            missing.append(item.nodeid)
    return missing


def check_may_start_server() -> None:
    """Raise if the running test may not start a server (see `refuse_servers`)."""
    if refuse_servers:
        raise RuntimeError(refuse_servers)


def _marks(expr: ast.expr) -> list[str]:
    """The `pytest.mark.<name>` names in a `pytestmark` value (one mark or a list of them)."""
    items = expr.elts if isinstance(expr, (ast.List, ast.Tuple)) else [expr]
    names = []
    for item in items:
        node = item.func if isinstance(item, ast.Call) else item
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "pytest.mark":
            names.append(node.attr)
    return names


def declared_tiers(module: Path, tests: Path) -> list[str]:
    """The tiers `module` declares, read as a reader would: its own `pytestmark`, and the
    `folder_tier(...)` of the conftest.py of each folder from it up to `tests`."""
    found = []
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            found += [name for name in _marks(node.value) if name in TIERS]
    folder = module.parent
    while folder == tests or tests in folder.parents:
        conftest = folder / "conftest.py"
        if conftest.exists():
            for node in ast.walk(ast.parse(conftest.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "folder_tier":
                    found += [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
        folder = folder.parent
    return found
