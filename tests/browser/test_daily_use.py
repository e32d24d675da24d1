"""What a user trips on in a day's use of the dashboard (issue 20's fixes), in a real Chromium
against a real `gradwatch serve` fed over /ws/ingest (synthetic.py; fixtures of test_dashboard.py).

Run: .venv/bin/python -m pytest tests/browser/test_daily_use.py
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import pytest
from support.server import ServerProcess
from playwright import sync_api
from support.synthetic import Ingest, SyntheticRun
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


def window_values(http: httpx.Client, run_id: str, key: str, start: int, end: int) -> list[float]:
    got = http.get(f"/api/runs/{run_id}/series", params={"key": key, "start": start, "end": end}).json()
    assert not got["downsampled"]
    return [float(v) for v in got["value"] if isinstance(v, (int, float)) and math.isfinite(v)]


def y_range(p: sync_api.Page, chart: str) -> list[float]:
    return p.evaluate("c => document.querySelector(`[data-chart=\"${c}\"]`)._fullLayout.yaxis.range.slice()", chart)


def test_zoom_normalises_a_reversed_window_and_fits_y_to_it(dash: ServerProcess, page: Page, http: httpx.Client) -> None:
    seed(dash, SyntheticRun("zoom-y", "zoom-y", total_steps=300), 300)
    p = page.open(dash.url + "/runs/zoom-y?from=280&to=240")  # written backwards
    p.wait_for_function("document.body.dataset.zoom === '240-280'")
    p.wait_for_function("() => new URL(location.href).search.includes('from=240&to=280')")
    assert p.evaluate("""document.querySelector('[data-chart="loss"]')._fullLayout.xaxis.range.slice()""") == [240, 280]

    # Linear (loss) and log (total gradient norm): y spans what the window holds, not the run.
    loss = window_values(http, "zoom-y", "loss", 240, 280)
    lo, hi = y_range(p, "loss")
    assert lo <= min(loss) and hi >= max(loss)
    assert hi - lo <= 1.2 * (max(loss) - min(loss)), (lo, hi, min(loss), max(loss))
    whole = window_values(http, "zoom-y", "loss", 1, 300)
    assert max(whole) > 2 * max(loss), "the run's early loss is far above the window's"

    total = window_values(http, "zoom-y", "grad_norm_total", 240, 280)
    lo, hi = y_range(p, "grad-norm-total")
    span = math.log10(max(total)) - math.log10(min(total))
    assert lo <= math.log10(min(total)) and hi >= math.log10(max(total))
    assert hi - lo <= 1.2 * span + 1e-9, (lo, hi, span)

    # Zooming out gives the whole run back, on x and y.
    p.locator('[data-chart="loss"] .nsewdrag').dblclick()
    p.wait_for_function("document.body.dataset.zoom === 'all'")
    lo, hi = y_range(p, "loss")
    assert lo <= min(whole) and hi >= max(whole)
    assert "from=" not in p.url


def box(p: sync_api.Page, selector: str) -> dict[str, float]:
    b = p.locator(selector).first.bounding_box()
    assert b is not None, f"{selector} is not drawn"
    return b


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] \
        and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


def test_the_zoom_hint_covers_nothing(dash: ServerProcess, page: Page) -> None:
    """A drag-zoom says how to zoom out in the top bar, not in a toast over the live indicator."""
    with Ingest(dash.ws_url, SyntheticRun("zoom-hint", "zoom-hint", total_steps=100)) as hook:
        hook.steps(100)
        p = page.open(dash.url + "/runs/zoom-hint")
        expect(p.locator(".run-header .live")).to_have_text("Live")
        area = box(p, '[data-chart="loss"] .nsewdrag')
        y = area["y"] + area["height"] / 2
        p.mouse.move(area["x"] + area["width"] * 0.3, y)
        p.mouse.down()
        p.mouse.move(area["x"] + area["width"] * 0.5, y, steps=5)
        p.mouse.move(area["x"] + area["width"] * 0.6, y, steps=5)
        p.mouse.up()
        p.wait_for_function("!['all', 'pending', undefined].includes(document.body.dataset.zoom)")
        note = p.locator(".topbar .zoom-note")
        expect(note).to_be_visible()
        expect(note).to_contain_text("Zoomed to steps")
        live = box(p, ".run-header .live")
        assert not overlap(box(p, ".topbar .zoom-note"), live)
        toasts = p.locator(".plotly-notifier .notifier-note")
        for i in range(toasts.count()):
            assert not overlap(toasts.nth(i).bounding_box() or {}, live), "a toast covers the live indicator"
        note.get_by_role("button").click()
        p.wait_for_function("document.body.dataset.zoom === 'all'")
        expect(note).to_be_hidden()
        hook.close("finished")
