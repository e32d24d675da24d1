"""Dependencies: every package the server and the hook pull in is pinned in constraints.txt, the
installed versions are those pins, and each pin clears the fixed version of the advisories we
know of (no advisory database is reachable from CI: this list is the offline part of the audit)."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]

#: package -> (first fixed version, advisories fixed by then)
KNOWN_FIXED = {
    "starlette": ("0.49.1", "CVE-2024-47874, CVE-2025-54121, CVE-2025-62727"),
    "h11": ("0.16.0", "CVE-2025-43859"),
    "tqdm": ("4.66.3", "CVE-2024-34062"),
    "pyarrow": ("14.0.1", "CVE-2023-47248"),
    "pydantic": ("2.4.0", "CVE-2024-3772"),
    "fastapi": ("0.109.1", "CVE-2024-24762"),
    "idna": ("3.7", "CVE-2024-3651"),
    "mako": ("1.2.2", "CVE-2022-40023"),
    "uvicorn": ("0.11.7", "CVE-2020-7694, CVE-2020-7695"),
    "websockets": ("9.1", "CVE-2021-33880"),
    "numpy": ("1.22.0", "CVE-2021-41496, CVE-2021-34141"),
    "aiohttp": ("3.12.14", "CVE-2024-23334, CVE-2024-52304, CVE-2025-53643"),
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[canonical(name)] = version
    return out


def runtime_closure() -> dict[str, str]:
    """Installed dependencies of gradwatch-server[postgres] and gradwatch, torch's own excluded."""
    seen: dict[str, str] = {}

    def walk(name: str, extras: tuple[str, ...] = ()) -> None:
        key = canonical(name)
        if key == "torch" or (key in seen and not extras):
            return
        dist = md.distribution(name)
        seen[key] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in (list(extras) or [""])):
                walk(req.name, tuple(req.extras))

    walk("gradwatch-server", ("postgres",))
    walk("gradwatch")
    for name in framework_requirements():
        walk(name)
    return {k: v for k, v in seen.items() if k not in ("gradwatch-server", "gradwatch")}


def framework_requirements() -> list[str]:
    """The hook's extras (read from the source tree: the installed metadata may predate them) and
    the test requirements that leave their version to constraints.txt (the frameworks the
    integration tests run against)."""
    project = tomllib.loads((ROOT / "trainer_hook" / "pyproject.toml").read_text())["project"]
    names = [Requirement(r).name for reqs in project.get("optional-dependencies", {}).values() for r in reqs]
    for line in (ROOT / "requirements-test.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and "==" not in line:
            names.append(Requirement(line).name)
    return names


def test_every_installed_dependency_is_the_pinned_version() -> None:
    pinned = pins()
    installed = runtime_closure()
    missing = sorted(set(installed) - set(pinned))
    assert not missing, f"not pinned in constraints.txt: {missing}"
    differ = {k: (v, pinned[k]) for k, v in installed.items() if v != pinned[k]}
    assert not differ, f"installed != pinned: {differ}"


@pytest.mark.parametrize("package", sorted(KNOWN_FIXED))
def test_pins_clear_known_advisories(package: str) -> None:
    pinned = pins()
    fixed, advisories = KNOWN_FIXED[package]
    assert package in pinned, f"{package} is no longer a dependency: drop it from KNOWN_FIXED"
    assert Version(pinned[package]) >= Version(fixed), f"{package} {pinned[package]} is before the fix of {advisories}"
