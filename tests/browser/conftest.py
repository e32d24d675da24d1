"""The fixtures of the browser tests: a real Chromium (`browser`), a real `gradwatch serve` per
module serving this checkout's frontend/ (`dash`), a page that fails its test on any JS error,
dialog or request beyond the server (`page`), and an HTTP client on that server (`http`).

The page wrapper and the shared constants are in tests/support/browser.py.
Run: .venv/bin/python -m pytest tests/browser -n 2
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright import sync_api

from support.browser import Page, chromium_path
from support.server import REPO, ServerProcess, start_server
from support.tiers import folder_tier

#: Every test here is of the `browser` tier (tests/support/tiers.py).
pytest_itemcollected = folder_tier("browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        yield b
        b.close()


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module, serving the dashboard from this checkout's frontend/."""
    server = start_server(tmp_path_factory.mktemp("dashboard"), env={"GRADWATCH_FRONTEND_DIR": str(REPO / "frontend")})
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(browser: sync_api.Browser) -> Iterator[Page]:
    p = Page(browser)
    yield p
    p.close()


@pytest.fixture
def http(dash: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=dash.url, timeout=30) as client:
        yield client
