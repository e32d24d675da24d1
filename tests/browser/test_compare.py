"""The compare page in a real Chromium against a real `gradwatch serve` (runs fed over /ws/ingest,
synthetic.py; the fixtures of conftest.py): two runs picked in the list and compared, the settings
table, layouts, alignment, parameters matched by name, and what it shows by default.

The compare page sets body[data-drawn] to "<x>:<layout>" once a view is drawn (and the charts
publish what they drew: tests/support/browser.py); the tests wait on those, never on sleeps.

Run: .venv/bin/python -m pytest tests/browser/test_compare.py
"""

from __future__ import annotations

import httpx
import pytest
from playwright import sync_api

from support.browser import Page, finding_counts, scalars_run, seed
from support.server import ServerProcess
from support.synthetic import SyntheticRun, _shapes

expect = sync_api.expect


def row(p: sync_api.Page, run_id: str) -> sync_api.Locator:
    return p.locator(f'tr[data-run-id="{run_id}"]')


def test_select_two_runs_and_compare(dash: ServerProcess, page: Page) -> None:
    seed(dash, SyntheticRun("pick-1", "first-pick", project="picking", seed=1, total_steps=30), 30)
    seed(dash, SyntheticRun("pick-2", "second-pick", project="picking", seed=2, total_steps=30), 20)
    seed(dash, SyntheticRun("pick-3", "not-picked", project="picking", seed=3, total_steps=30), 10)
    p = page.open(dash.url + "/?project=picking")
    compare = p.locator("#compare")
    expect(compare).to_be_disabled()
    row(p, "pick-1").locator('input[type="checkbox"]').check()
    expect(compare).to_be_disabled()  # one run is no comparison
    row(p, "pick-2").locator('input[type="checkbox"]').check()
    expect(compare).to_have_text("Compare 2 runs")
    compare.click()
    p.wait_for_url("**/compare?runs=pick-1,pick-2*")
    p.wait_for_function("document.body.dataset.drawn === 'step:overlay'")
    expect(p.locator(".compare-run a")).to_have_text(["first-pick", "second-pick"])
    expect(p.locator("#settings tbody tr")).to_have_count(2)
    page.wait_points("compare-grad-norm-total", 50)
    assert page.points("compare-grad-norm-total") == 50
    series = p.evaluate("""() => document.querySelector('[data-chart="compare-loss"]').data
        .filter(t => t.name !== 'NaN / Inf').map(t => [t.name, t.x.length])""")
    assert series == [["first-pick", 30], ["second-pick", 20]]


def test_compare_settings_layouts_alignment_and_parameters(dash: ServerProcess, page: Page, http: httpx.Client) -> None:
    no_head = [(name, shape) for name, shape in _shapes() if name != "head.weight"]
    seed(dash, SyntheticRun("cmp-x", "run-x", project="comparing", seed=1, nan_steps={12}, total_steps=40), 40)
    seed(dash, SyntheticRun("cmp-y", "run-y", project="comparing", seed=2, total_steps=40, params=no_head), 25)
    runs = {r: http.get(f"/api/runs/{r}").json() for r in ("cmp-x", "cmp-y")}
    p = page.open(dash.url + "/compare?runs=cmp-x,cmp-y")
    p.wait_for_function("document.body.dataset.drawn === 'step:overlay'")

    # Settings: optimizer, learning rate per group, parameters, steps, status, findings.
    for run_id, run in runs.items():
        tr = p.locator(f'#settings tbody tr[data-run-id="{run_id}"]')
        expect(tr.locator('[data-field="optimizer"]')).to_have_text("AdamW")
        expect(tr.locator('[data-field="lr"] .lr')).to_have_text(["group 0 3.00e-4", "no_decay 3.00e-4"])
        expect(tr.locator('[data-field="params"]')).to_contain_text(f"{run['param_count']} tensors")
        expect(tr.locator('[data-field="steps"]')).to_have_text(str(run["steps"]))
        expect(tr.locator('[data-field="status"]')).to_have_text("finished")
        counts = finding_counts(http, run_id)
        cell = tr.locator('[data-field="findings"]')
        expect(cell).to_have_attribute("data-errors", str(counts["error"]))
        expect(cell).to_have_attribute("data-warnings", str(counts["warning"]))
    expect(p.locator('#settings tr[data-run-id="cmp-x"] .fcount-error')).to_have_text("1 error")

    # Overlaid, by step: one chart, a line per run, x = steps.
    assert page.points("compare-loss") == 65
    xs = p.evaluate("""() => document.querySelector('[data-chart="compare-loss"]').data
        .filter(t => t.name !== 'NaN / Inf').map(t => t.x.slice(0, 3))""")
    assert xs == [[1, 2, 3], [1, 2, 3]]

    # Side by side: a panel per run, with the same x and y ranges.
    p.get_by_role("button", name="side by side").click()
    p.wait_for_function("document.body.dataset.drawn === 'step:side'")
    assert "layout=side" in p.url
    panels = p.locator('[data-card="compare-loss"] .panels [data-chart]')
    expect(panels).to_have_count(2)
    expect(p.locator('[data-chart="compare-loss"]')).to_be_hidden()
    assert [int(x) for x in panels.evaluate_all("els => els.map(e => e.dataset.points)")] == [40, 25]
    expect(p.locator('[data-card="compare-loss"] .panel-title')).to_have_text(["run-x", "run-y"])
    ranges = panels.evaluate_all("els => els.map(e => [e.layout.xaxis.range, e.layout.yaxis.range])")
    assert ranges[0] == ranges[1] and ranges[0][0] == [1, 40]
    log_ranges = p.locator('[data-card="compare-grad-norm-total"] .panels [data-chart]').evaluate_all(
        "els => els.map(e => [e.layout.yaxis.type, e.layout.yaxis.range])"
    )
    assert log_ranges[0] == log_ranges[1] and log_ranges[0][0] == "log"

    # Wall time: seconds since each run's first step (the synthetic runs step every 0.1 s).
    p.get_by_role("button", name="wall time").click()
    p.wait_for_function("document.body.dataset.drawn === 'time:side'")
    p.get_by_role("button", name="overlaid").click()
    p.wait_for_function("document.body.dataset.drawn === 'time:overlay'")
    assert "x=time" in p.url and "layout" not in p.url
    loss = p.locator('[data-chart="compare-loss"]')
    xs = loss.evaluate("el => el.data.filter(t => t.name !== 'NaN / Inf').map(t => t.x.slice(0, 3))")
    assert xs == [[0, 0.1, 0.2], [0, 0.1, 0.2]]
    assert loss.evaluate("el => el.layout.xaxis.title.text") == "seconds since the run's first step"
    assert loss.evaluate("el => el.layout.xaxis.range[1]") == pytest.approx(3.9, abs=0.3)

    # The URL holds the view.
    shared = p.url
    p = page.open(shared)
    p.wait_for_function("document.body.dataset.drawn === 'time:overlay'")
    expect(p.get_by_role("button", name="wall time")).to_have_attribute("aria-pressed", "true")
    expect(p.get_by_role("button", name="overlaid")).to_have_attribute("aria-pressed", "true")

    # Parameters by name: drawn for every run that has one of that name.
    first = p.locator('[data-card="compare-param-0"]')
    expect(first).to_have_attribute("data-param", "tok_emb.weight")  # the first shared one
    p.fill('[data-card="compare-params"] input[type="search"]', "head.weight")
    p.keyboard.press("Enter")
    head = p.locator('[data-card^="compare-param-"][data-param="head.weight"]')
    expect(head).to_contain_text("In 1 of 2 runs; not in run-y")
    p.wait_for_function(
        """() => +document.querySelector('[data-card][data-param="head.weight"] [data-chart]').dataset.points === 40"""
    )
    assert "param=head.weight" in p.url and "param=tok_emb.weight" in p.url
    p.wait_for_function(
        """() => +document.querySelector('[data-card][data-param="tok_emb.weight"] [data-chart]').dataset.points === 65"""
    )
    p.fill('[data-card="compare-params"] input[type="search"]', "no.such.param")
    p.keyboard.press("Enter")
    expect(p.locator('[data-card="compare-params"] .picker-error')).to_contain_text("No run has a parameter named")
    p.get_by_role("button", name="Remove tok_emb.weight").click()
    expect(p.locator('[data-card^="compare-param-"][data-param]')).to_have_count(1)
    assert "param=tok_emb.weight" not in p.url


def test_compare_defaults_to_what_every_run_has(dash: ServerProcess, page: Page) -> None:
    seed(dash, scalars_run("def-x", ["x.weight", "s.weight"], ("aaa_only", "acc", "backward_passes")), 10)
    seed(dash, scalars_run("def-y", ["s.weight", "y.weight"], ("acc", "backward_passes")), 10)
    seed(dash, scalars_run("def-z", ["z.weight", "z.bias"], ("acc", "backward_passes")), 10)
    p = page.open(dash.url + "/compare?runs=def-x,def-y,def-z")
    p.wait_for_function("document.body.dataset.drawn === 'step:overlay'")
    # No parameter is in all three runs: the one in most of them.
    expect(p.locator('[data-card="compare-param-0"]')).to_have_attribute("data-param", "s.weight")
    # A scalar every run has, the user's before the hook's.
    expect(p.locator('[data-card="compare-scalar"] select')).to_have_value("acc")
    assert page.points("compare-scalar") == 30
    assert "scalar=acc" in p.url and "param=s.weight" in p.url
