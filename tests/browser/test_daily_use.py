"""What a user trips on in a day's use of the dashboard (issue 20's fixes), in a real Chromium
against a real `gradwatch serve` fed over /ws/ingest (synthetic.py; fixtures of test_dashboard.py).

Run: .venv/bin/python -m pytest tests/browser/test_daily_use.py
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import pytest
from conftest import ServerProcess
from playwright import sync_api
from synthetic import SyntheticRun
from test_dashboard import Page, browser, dash, page, seed  # noqa: F401  (browser, dash, page: fixtures)

pytestmark = pytest.mark.browser
expect = sync_api.expect


@pytest.fixture
def http(dash: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=dash.url, timeout=30) as client:
        yield client


def chips(p: sync_api.Page) -> list[str]:
    return p.locator(".picker .chip-name").all_text_contents()


def test_parameter_box_matches_as_the_user_types(dash: ServerProcess, page: Page) -> None:
    """Part of a name, in any case, lists the matches; Enter takes the first; an unknown name says so."""
    seed(dash, SyntheticRun("picker-run", "picker", total_steps=20), 20)
    p = page.open(dash.url + "/runs/picker-run")
    box = p.locator('.picker input[type="search"]')
    matches = p.locator(".picker-matches .picker-match")
    before = chips(p)

    box.fill("QKV.B")
    expect(matches).to_have_text(["blocks.0.attn.qkv.bias", "blocks.1.attn.qkv.bias"])
    box.fill("attn")
    expect(matches).to_have_count(6)  # qkv.weight, qkv.bias, proj.weight of each block
    box.fill("HEAD")
    expect(matches).to_have_text(["head.weight"])
    assert "head.weight" not in before
    box.press("Enter")
    expect(p.locator(".picker .chip-name", has_text="head.weight")).to_have_count(1)
    assert box.input_value() == ""
    expect(p.locator(".picker-matches")).to_be_hidden()
    p.wait_for_function("() => new URL(location.href).searchParams.getAll('param').includes('head.weight')")

    # A click on a listed match adds that one.
    box.fill("fc2")
    p.locator(".picker-match", has_text="blocks.1.mlp.fc2.weight").click()
    expect(p.locator(".picker .chip-name", has_text="blocks.1.mlp.fc2.weight")).to_have_count(1)

    # A name no parameter has: said, and the text stays for the user to fix.
    box.fill("nope.weight")
    expect(matches).to_have_count(0)
    p.get_by_role("button", name="Add", exact=True).click()
    expect(p.locator(".picker-error")).to_have_text("No parameter matches “nope.weight”")
    assert box.input_value() == "nope.weight"
