"""The dashboard in a real Chromium against a real `gradwatch serve`, fed over /ws/ingest.

Data comes from hand-built protocol v1 messages (synthetic.py), not from the hook. The pages
publish what they drew (tests/support/browser.py says how); the tests wait on that, never on
sleeps. The fixtures are in conftest.py.

Run: .venv/bin/python -m pytest tests/browser -n 2
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from playwright import sync_api

from support.browser import CHARTS, REAL_RUN_CHARTS, XSS_NAME, XSS_PARAM, XSS_PROJECT, Page, seed
from support.server import REPO, ServerProcess
from support.synthetic import Ingest, SyntheticRun

#: Where the README's screenshot goes when `make screenshot` asks for it (docs/screenshot.png);
#: a plain test run writes it under its temporary folder, leaving the checkout as it was.
SCREENSHOT_ENV = "GRADWATCH_SCREENSHOT"


def test_run_list_shows_runs_and_renders_names_as_text(dash: ServerProcess, page: Page) -> None:
    seed(dash, SyntheticRun("list-plain", "baseline-adamw", project="vision"), 12)
    seed(
        dash,
        SyntheticRun("list-xss", XSS_NAME, project=XSS_PROJECT, params=[(XSS_PARAM, [4, 4]), ("fc.bias", [4])]),
        12,
    )
    p = page.open(dash.url + "/")
    rows = p.locator("tbody tr")
    sync_api.expect(p.locator('tr[data-run-id="list-plain"] .run-link')).to_have_text("baseline-adamw")
    xss_row = p.locator('tr[data-run-id="list-xss"]')
    sync_api.expect(xss_row.locator(".run-link")).to_have_text(XSS_NAME)
    sync_api.expect(xss_row).to_contain_text(XSS_PROJECT)
    assert rows.count() >= 2
    assert p.locator("img[src='x']").count() == 0
    assert p.locator("tbody script").count() == 0

    # The filter narrows the list, and the URL keeps it.
    p.fill("#filter-text", "baseline")
    sync_api.expect(p.locator("tbody tr")).to_have_count(1)
    assert "q=baseline" in p.url

    # On the run page the run and parameter names are text too, in the DOM and in Plotly's SVG.
    p = page.open(dash.url + "/runs/list-xss")
    sync_api.expect(p.locator(".run-name-text")).to_have_text(XSS_NAME)
    sync_api.expect(p.locator(".chip-name", has_text=XSS_PARAM)).to_have_count(1)
    page.wait_points("grad-status", 1)
    ticks = p.locator('[data-chart="grad-status"] .ytick text').all_text_contents()
    assert XSS_PARAM in ticks
    assert p.locator("img[src='x']").count() == 0
    assert p.locator("[data-chart] b, .chip b").count() == 0


def test_run_list_updates_live(dash: ServerProcess, page: Page) -> None:
    p = page.open(dash.url + "/")
    p.evaluate("window.__sameDocument = true")
    with Ingest(dash.ws_url, SyntheticRun("list-live", "appears-live")) as hook:
        hook.steps(3)
        row = p.locator('tr[data-run-id="list-live"]')
        sync_api.expect(row.locator(".badge")).to_have_text("running")
        hook.close("finished")
        sync_api.expect(row.locator(".badge")).to_have_text("finished")
    assert p.evaluate("window.__sameDocument") is True


def test_run_page_draws_charts_and_shows_nan(dash: ServerProcess, page: Page) -> None:
    seed(dash, SyntheticRun("nan-run", "nan-at-30", nan_steps={30, 31}, total_steps=60), 60)
    p = page.open(dash.url + "/runs/nan-run")
    sync_api.expect(p.locator(".run-name .badge")).to_have_text("finished")
    sync_api.expect(p.locator('[data-field="steps"]')).to_have_text("60")
    for chart in CHARTS:
        assert page.points(chart) > 0, f"{chart} drew nothing"
    assert page.points("grad-norm-total") == 60

    # NaN is drawn, not dropped: red markers with hover text, and red heatmap cells.
    assert page.nonfinite("grad-norm-total") == 2
    assert page.nonfinite("loss") == 2
    assert page.nonfinite("grad-status") >= 2
    assert page.nonfinite("grad-norm-heatmap") >= 2
    texts = p.evaluate("""() => document.querySelector('[data-chart="loss"]').data
        .filter(t => t.name === 'NaN / Inf').flatMap(t => t.text)""")
    assert len(texts) == 2 and all("NaN" in t for t in texts)
    assert p.locator('[data-chart="loss"] .scatterlayer .trace:last-child path.point').count() == 2

    # Any parameter can be added by name; the view goes into the URL.
    p.fill('.picker input[type="search"]', "blocks.1.attn.qkv.bias")
    p.press('.picker input[type="search"]', "Enter")
    sync_api.expect(p.locator(".chip-name", has_text="blocks.1.attn.qkv.bias")).to_have_count(1)
    p.wait_for_function("""+document.querySelector('[data-chart="param-grad-norm"]').dataset.nonfinite >= 2""")
    assert "param=blocks.1.attn.qkv.bias" in p.url
    shared = p.url
    p = page.open(shared)
    sync_api.expect(p.locator(".chip-name", has_text="blocks.1.attn.qkv.bias")).to_have_count(1)
    assert page.nonfinite("param-grad-norm") == 2

    # Nothing offers to upload a chart (Plotly's "Share chart" goes to Plotly's cloud).
    assert p.locator('.modebar-btn[data-title^="Share"]').count() == 0

    hrefs = p.locator("[data-export]").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert hrefs == [f"/api/runs/nan-run/export?format={f}" for f in ("csv", "json", "parquet")] + [
        f"/api/runs/nan-run/export?format={f}&table=steps" for f in ("csv", "parquet")
    ]


def test_new_steps_appear_without_reload(dash: ServerProcess, page: Page) -> None:
    run = SyntheticRun("live-run", "live-steps", nan_steps={25}, total_steps=100)
    with Ingest(dash.ws_url, run) as hook:
        hook.steps(20)
        p = page.open(dash.url + "/runs/live-run")
        sync_api.expect(p.locator(".live")).to_have_text("Live")
        assert page.points("grad-norm-total") == 20
        p.evaluate("window.__sameDocument = true")

        hook.steps(10)
        page.wait_points("grad-norm-total", 30)
        page.wait_points("loss", 30)
        p.wait_for_function("""+document.querySelector('[data-chart="loss"]').dataset.nonfinite === 1""")
        sync_api.expect(p.locator('[data-field="steps"]')).to_have_text("30")

        hook.close("finished")
        sync_api.expect(p.locator(".run-name .badge")).to_have_text("finished")
    assert p.evaluate("window.__sameDocument") is True
    assert page.points("grad-norm-total") == 30
    xs = p.evaluate("""() => document.querySelector('[data-chart="grad-norm-total"]').data
        .find(t => t.name !== 'NaN / Inf').x""")
    assert xs == list(range(1, 31))  # each step once, in order


def test_a_run_page_opened_before_its_run_waits_for_it(dash: ServerProcess, page: Page) -> None:
    """watch() prints the run's address before its hello reaches the server (and a spooled run
    arrives with `gradwatch sync`): the page says it waits, then shows the run, without a reload."""
    p = page.page
    p.goto(dash.url + "/runs/early-bird")
    sync_api.expect(p.locator("#page-notice .notice-title")).to_have_text("Waiting for this run")
    sync_api.expect(p.locator("#page-notice")).to_contain_text("early-bird")
    assert p.evaluate("document.body.dataset.state") == "waiting"
    assert p.locator("#charts").is_hidden()
    p.evaluate("window.__sameDocument = true")
    run = SyntheticRun("early-bird", "early bird", total_steps=20)
    with Ingest(dash.ws_url, run) as hook:
        hook.steps(20)
        p.wait_for_function("document.body.dataset.ready === '1'")
        page.wait_points("grad-norm-total", 20)
        hook.close("finished")
    sync_api.expect(p.locator(".run-name")).to_contain_text("early bird")
    assert p.locator("#page-notice").inner_text() == ""
    assert p.locator("#charts").is_visible()
    assert p.evaluate("window.__sameDocument") is True
    # The only console errors: the browser's own line for each 404 while it waited.
    assert all("status of 404" in e for e in page.errors), page.errors
    page.errors.clear()


def test_compare_page(dash: ServerProcess, page: Page) -> None:
    seed(dash, SyntheticRun("cmp-a", "cmp-a", seed=1, total_steps=50), 50)
    seed(dash, SyntheticRun("cmp-b", "cmp-b", seed=2, total_steps=50), 40)
    p = page.open(dash.url + "/compare?runs=cmp-a,cmp-b")
    sync_api.expect(p.locator(".compare-run a")).to_have_text(["cmp-a", "cmp-b"])
    assert page.points("compare-grad-norm-total") == 90
    assert page.points("compare-loss") == 90


@pytest.mark.timed
def test_real_training_streams_live_and_draws_the_readme_screenshot(
    dash: ServerProcess, browser: sync_api.Browser, tmp_path: Path
) -> None:
    """examples/train_transformer.py with the hook: points appear while it trains; then the
    README's screenshot is taken of what it drew (into docs/screenshot.png by `make screenshot`)."""
    screenshot = Path(os.environ.get(SCREENSHOT_ENV) or tmp_path / "screenshot.png")
    steps = 120
    train = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "examples" / "train_transformer.py"),
            "--server",
            dash.url,
            "--steps",
            str(steps),
            "--delay",
            "0.05",
            "--run",
            "tiny-gpt-lr3e-3",
            "--project",
            "demo",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    shot = Page(browser)
    try:
        assert train.stdout is not None
        first = train.stdout.readline()
        assert first.startswith("gradwatch run id: "), first
        run_id = first.split(": ", 1)[1].strip()
        # The id is printed by watch(), which never waits for the server: the page may open
        # before the hook's hello has reached it, and then waits for the run.
        p = shot.open(f"{dash.url}/runs/{run_id}")
        p.evaluate("window.__sameDocument = true")
        shot.wait_points("grad-norm-total", 5)
        seen = shot.points("grad-norm-total")
        assert seen < steps, "the page opened after the run ended: nothing was shown live"
        shot.wait_points("grad-norm-total", seen + 10)  # new points while the run trains
        shot.wait_points("loss", seen + 10)
        assert p.evaluate("window.__sameDocument") is True  # no reload
        assert train.wait(timeout=120) == 0, train.stdout.read()
        sync_api.expect(p.locator(".run-name .badge")).to_have_text("finished")
        p.reload()  # the finished run as stored: every step
        p.wait_for_function("document.body.dataset.ready === '1'")
        shot.wait_points("grad-norm-total", steps)
        for chart in REAL_RUN_CHARTS:
            p.locator(f'[data-chart="{chart}"]').scroll_into_view_if_needed()
            shot.wait_points(chart, 1)
        p.evaluate("window.scrollTo(0, 0)")
        p.evaluate("document.fonts.ready")
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        p.screenshot(path=str(screenshot), full_page=True)
    finally:
        if train.poll() is None:
            train.kill()
        # A page opened before the run reached the server waited for it: the browser's console
        # has a line for each 404 it got meanwhile, and nothing else.
        shot.errors = [e for e in shot.errors if "status of 404" not in e]
        shot.close()
    png = screenshot.read_bytes()
    assert re.match(rb"\x89PNG", png[:4])
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")  # IHDR
    assert width >= 1000 and height >= 900, (width, height)  # the whole page, not an empty frame


def test_wire_values_convert_in_one_place(dash: ServerProcess, page: Page) -> None:
    """format.js: "NaN"/"Infinity"/"-Infinity" are numbers, null stays ABSENT, names stay text."""
    p = page.open(dash.url + "/")
    got = p.evaluate("""async () => {
        const f = await import('/static/js/format.js');
        const n = ['NaN', 'Infinity', '-Infinity', null, 2.5].map(f.toNumber);
        return {
            nan: Number.isNaN(n[0]), inf: n[1] === Infinity, ninf: n[2] === -Infinity, absent: n[3] === null,
            plain: n[4], labels: n.map((v) => f.fmtNum(v)),
            text: f.plotlyText('<b>a</b>&'), bytes: f.fmtBytes(3 * 2 ** 20),
            status: ['none', 'zero', 'nonzero', 'nonfinite', 3, null].map(f.statusCode),
        };
    }""")
    assert got == {
        "nan": True,
        "inf": True,
        "ninf": True,
        "absent": True,
        "plain": 2.5,
        "labels": ["NaN", "+Inf", "-Inf", "—", "2.5"],
        "text": "&lt;b&gt;a&lt;/b&gt;&amp;",
        "bytes": "3 MiB",
        "status": [0, 1, 2, 3, 3, None],
    }


class FindingsRun(SyntheticRun):
    """A synthetic run whose hello also reports parameters left out of the optimizer."""

    unoptimized: tuple[str, ...] = ()

    def hello(self) -> dict[str, object]:
        message = super().hello()
        message["run"]["config"]["unoptimized_params"] = list(self.unoptimized)  # type: ignore[index]
        return message


def finding_row(p: sync_api.Page, code: str) -> sync_api.Locator:
    return p.locator(f'.findings .finding[data-code="{code}"]')


def test_findings_panel_and_chart_markers(dash: ServerProcess, page: Page) -> None:
    """A stored run: each finding in the panel (severity, message, step, parameters as text),
    and a dotted marker where it began on the step-axis charts."""
    run = FindingsRun("found-run", "has-findings", nan_steps={30, 31}, total_steps=60)
    run.unoptimized = (XSS_PARAM,)
    seed(dash, run, 60)
    p = page.open(dash.url + "/runs/found-run")
    nonfinite = finding_row(p, "nonfinite_grad")
    sync_api.expect(nonfinite).to_have_attribute("data-severity", "error")
    sync_api.expect(nonfinite.locator(".finding-msg")).to_contain_text("Gradients became NaN or Inf at step 30")
    sync_api.expect(nonfinite.locator(".finding-step")).to_have_text(" · from step 30")
    sync_api.expect(nonfinite.locator(".finding-params .chip")).to_have_text(
        ["blocks.1.attn.qkv.bias", "blocks.1.mlp.fc1.weight"]
    )
    never = finding_row(p, "param_never_gets_grad")
    sync_api.expect(never).to_have_attribute("data-severity", "warning")
    sync_api.expect(never.locator(".finding-params .chip")).to_have_text(["adapter.weight"])
    left_out = finding_row(p, "param_not_in_optimizer")
    sync_api.expect(left_out.locator(".finding-params .chip")).to_have_text([XSS_PARAM])  # text, not markup
    sync_api.expect(left_out.locator(".finding-step")).to_have_text(" · from the start")
    assert p.locator(".findings b").count() == 0
    sync_api.expect(p.locator(".findings .count")).to_have_attribute("data-severity", "error")
    # Errors first. The seeded norms jump 8x at step 33: a grad_norm_spike warning of its own.
    assert p.locator(".findings .finding").evaluate_all("els => els.map(e => e.dataset.severity)") == [
        "error",
        "warning",
        "warning",
        "warning",
    ]
    sync_api.expect(finding_row(p, "grad_norm_spike").locator(".finding-step")).to_have_text(" · from step 33")

    # Markers: where each finding with a step began, on line charts and heatmaps alike.
    for chart in ("grad-norm-total", "loss", "param-grad-norm", "grad-status", "grad-norm-heatmap"):
        p.wait_for_function(
            "c => document.querySelector(`[data-chart=\"${c}\"]`).dataset.markers === '1,30,33'", arg=chart
        )
    shapes = p.evaluate("""() => document.querySelector('[data-chart="loss"]').layout.shapes
        .map(s => [s.x0, s.line.dash])""")
    assert shapes == [[1, "dot"], [30, "dot"], [33, "dot"]]
    labels = p.evaluate("""() => document.querySelector('[data-chart="loss"]').layout.annotations.map(a => a.text)""")
    assert labels == ["param_never_gets_grad", "nonfinite_grad", "grad_norm_spike"]

    # A parameter of a finding goes into the per-parameter chart with a click.
    never.locator(".chip", has_text="adapter.weight").click()
    sync_api.expect(p.locator(".chip-name", has_text="adapter.weight")).to_have_count(1)


def test_findings_arrive_live(dash: ServerProcess, page: Page) -> None:
    """A running run: findings appear in the panel and on the charts as the steps that cause
    them arrive, without reloading the page."""
    with Ingest(dash.ws_url, SyntheticRun("live-found", "live-findings", nan_steps={16}, total_steps=60)) as hook:
        hook.steps(5)
        p = page.open(dash.url + "/runs/live-found")
        sync_api.expect(p.locator(".live")).to_have_text("Live")
        sync_api.expect(p.locator(".findings-ok")).to_contain_text("No problems found")
        p.evaluate("window.__sameDocument = true")
        hook.steps(7)  # step 10: adapter.weight has had no gradient for 10 steps
        sync_api.expect(finding_row(p, "param_never_gets_grad")).to_have_count(1)
        hook.steps(6)  # step 16: NaN
        sync_api.expect(finding_row(p, "nonfinite_grad").locator(".finding-step")).to_have_text(" · from step 16")
        p.wait_for_function("""document.querySelector('[data-chart="grad-norm-total"]').dataset.markers === '1,16'""")
        hook.close("finished")
    assert p.evaluate("window.__sameDocument") is True
