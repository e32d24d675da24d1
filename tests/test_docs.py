"""The documentation's own promises: a README read in five minutes, links that lead somewhere, and
benchmark tables that say when, where and at which commit they were measured (docs/development.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = sorted(
    [
        README,
        REPO / "CHANGELOG.md",
        REPO / "backend" / "README.md",
        REPO / "trainer_hook" / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]
)
DATE = re.compile(r"20\d{2}-[01]\d-[0-3]\d")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as dashes."""
    headings = re.findall(r"^#+ (.*)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)


def test_the_readme_is_short_and_undated() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/ (limit 250)"
    dated = [line for line in lines if DATE.search(line)]
    assert not dated, f"README.md carries dates (they belong in docs/benchmarks.md or CHANGELOG.md): {dated}"


def test_every_percentage_in_the_readme_links_to_how_it_was_measured() -> None:
    """A measured figure in the README is a link into docs/ (the settings it states are not percentages
    of a measurement, except the 0.4% budget of every="auto", which is a setting and said as one)."""
    for line in prose(README).splitlines():
        for figure in re.finditer(r"[+-]?\d[\d.,]*%", line):
            if figure.group() == "0.4%" and "every" in line:
                continue  # every="auto"'s budget: an argument's meaning, not a measurement
            before = line[: figure.start()]
            assert before.endswith("[") and line[figure.end() :].startswith("](docs/"), (
                f"README figure {figure.group()} is not a link to the docs page that measured it: {line}"
            )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_somewhere(page: Path) -> None:
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # an external address
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"
        if anchor:
            assert anchor in anchors(resolved), f"{page.relative_to(REPO)} links to #{anchor}, no such heading"


def test_every_benchmark_table_is_stamped_with_date_and_commit() -> None:
    """Each "Latest table" section of docs/benchmarks.md says when and at which commit it was measured."""
    sections = re.split(r"^### ", (REPO / "docs" / "benchmarks.md").read_text(), flags=re.M)
    latest = [s for s in sections if s.startswith("Latest table")]
    assert len(latest) >= 3, "docs/benchmarks.md should have a latest table for overhead, storage and the dashboard"
    for section in latest:
        stamp = section.split("|", 1)[0]
        assert DATE.search(stamp) and re.search(r"commit\s+`[0-9a-f]{7,40}`", stamp), (
            f"a benchmark table without its date and commit: {section[:200]}"
        )


MAPS = {
    REPO / "trainer_hook" / "gradwatch": (REPO / "docs" / "development.md", "The hook's modules"),
    REPO / "backend" / "gradwatch_server": (REPO / "backend" / "README.md", "## Layout"),
}


def module_map(package: Path) -> str:
    """The part of the page that maps the package: from its heading to the next heading."""
    page, heading = MAPS[package]
    text = page.read_text()
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start : end if end > 0 else None]


def modules(package: Path) -> set[str]:
    """A package's modules as its map names them: `watcher.py`, `integrations/common.py`, and a
    subpackage (`store/`) as one entry; `__init__`s, migrations and `_site/` are left out."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).parts
        if path.name == "__init__.py" or parts[0] in {"migrations", "_site"}:
            continue
        found.add(parts[0] + "/" if len(parts) > 1 and parts[0] != "integrations" else "/".join(parts))
    return found


def named(text: str, module: str) -> bool:
    """The map names `module` as a word: `jobs.py` is not found inside `job_ranks.py`."""
    return re.search(rf"(?<![\w.]){re.escape(module)}(?![\w])", text) is not None or (
        "/" in module.rstrip("/") and named(text, module.split("/")[-1])
    )


@pytest.mark.parametrize("package", sorted(MAPS), ids=lambda p: p.name)
def test_the_module_map_names_every_module_and_only_modules_that_exist(package: Path) -> None:
    """docs/development.md (the hook) and backend/README.md (the server) name each module, so that
    a newcomer can hold the map against the tree: a module added, moved or removed updates its map."""
    text = module_map(package)
    names = modules(package)
    assert len(names) > 10
    missing = sorted(n for n in names if not named(text, n))
    assert missing == [], f"{MAPS[package][0].relative_to(REPO)} does not name {missing}"
    mentioned = set(re.findall(r"(?<![\w./])([a-z_]+\.py)\b", text))
    gone = sorted(m for m in mentioned if not any(package.rglob(m)))
    assert gone == [], f"{MAPS[package][0].relative_to(REPO)} names modules that are not there: {gone}"
