"""The run page's context and alerts in a real Chromium, for runs trained here with the real hook
into a real `gradwatch serve`: the Run panel shows what watch() recorded (command, git, host,
versions, param groups, the user's config, as text); the export buttons give both tables; the
spread chart draws what /params/spread says and follows live steps; a shared crosshair marks the
hovered step on every chart; a background tab counts the findings in its title, and desktop
notifications come only once turned on.

Run: .venv/bin/python -m pytest tests/browser/test_run_context.py
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from playwright import sync_api

import gradwatch
from support.browser import XSS_NAME, Page, seed
from support.ema import reference_ema
from support.sent import wait_serialized
from support.server import ServerProcess
from support.synthetic import SyntheticRun

CONFIG = {"dataset": {"name": "tiny", "seed": 3}, "note": XSS_NAME, "batch_size": 8}


def train(
    server: str,
    run: str,
    steps: int,
    *,
    zero_grad: bool = True,
    w: gradwatch.Watcher | None = None,
    model: torch.nn.Module | None = None,
    opt: torch.optim.Optimizer | None = None,
) -> tuple[Any, Any, Any]:
    """`steps` steps of a two-layer net with named param groups; returns (watcher, model, optimizer)."""
    if model is None or opt is None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        opt = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": 0.1, "name": "decay"},
                {"params": rest, "weight_decay": 0.0, "name": "no_decay"},
            ],
            lr=3e-4,
        )
    if w is None:
        w = gradwatch.watch(opt, model=model, run=run, project="context", server=server, warn=False, config=CONFIG)
    for _ in range(steps):
        if zero_grad:
            opt.zero_grad()
        loss = model(torch.randn(8, 6)).pow(2).mean()
        loss.backward()
        w.log(loss=loss.detach())
        opt.step()
    return w, model, opt


def test_the_run_panel_shows_what_watch_recorded(dash: ServerProcess, page: Page) -> None:
    w, _, _ = train(dash.url, "panel", 6)
    w.close(timeout=30)
    ctx = w._sender.hello["run"]["config"]["context"]
    p = page.open(f"{dash.url}/runs/{w.run_id}")
    card = p.locator('[data-card="run-context"]')
    summary = card.locator(".ctx-summary")
    sync_api.expect(summary).to_contain_text(f"torch {torch.__version__}")
    assert card.locator("[data-field=argv]").is_hidden()  # closed to one line until asked
    card.locator("summary").click()
    assert card.locator("[data-field=argv] code").inner_text() == shlex.join(sys.argv)
    git = card.locator("[data-field=git]").inner_text()
    assert (ctx["git"]["commit"] in git) if ctx["git"] else "not a git checkout" in git
    assert card.locator("[data-field=host] td").inner_text() == ctx["host"]
    assert f"python {ctx['versions']['python']}" in card.locator("[data-field=versions]").inner_text()
    assert card.locator("[data-field=model] td").inner_text() == "torch.nn.modules.container.Sequential"
    groups = card.locator("[data-field=optimizer] tr[data-group]")
    assert groups.count() == 2
    assert groups.nth(0).locator("td").first.inner_text() == "decay"
    assert groups.nth(1).locator("td").first.inner_text() == "no_decay"
    assert groups.nth(0).locator('[data-hparam="weight_decay"]').inner_text() == "weight_decay 0.1"
    assert groups.nth(1).locator('[data-hparam="lr"]').inner_text() == "lr 0.0003"
    assert card.locator("[data-field=optimizer] code").first.inner_text() == "torch.optim.adamw.AdamW"
    user = card.locator("[data-field=user]")
    assert user.locator('tr[data-key="dataset.name"] td').inner_text() == "tiny"
    assert user.locator('tr[data-key="dataset.seed"] td').inner_text() == "3"
    assert user.locator('tr[data-key="note"] td').inner_text() == XSS_NAME  # text, never markup
    assert p.locator("img[src=x]").count() == 0


def test_export_buttons_give_both_tables(dash: ServerProcess, page: Page) -> None:
    w, _, _ = train(dash.url, "exports", 5)
    w.close(timeout=30)
    p = page.open(f"{dash.url}/runs/{w.run_id}")
    for name, head in (("csv", "step,param,grad_norm"), ("steps-csv", "step,time,")):
        href = p.locator(f'[data-export="{name}"]').get_attribute("href")
        assert href is not None
        answer = p.request.get(dash.url + href)
        assert answer.ok and answer.text().startswith(head), name
    steps = p.request.get(dash.url + (p.locator('[data-export="steps-csv"]').get_attribute("href") or "")).text()
    assert len(steps.strip().splitlines()) == 1 + 5 and "loss" in steps.splitlines()[0].split(",")
    parquet = p.locator('[data-export="steps-parquet"]').get_attribute("href")
    assert parquet == f"/api/runs/{w.run_id}/export?format=parquet&table=steps"


def test_the_spread_chart_draws_the_api_and_follows_live_steps(dash: ServerProcess, page: Page) -> None:
    w, model, opt = train(dash.url, "spread", 12)
    assert wait_serialized(w._sender, 10)
    p = page.open(f"{dash.url}/runs/{w.run_id}")
    plot = p.locator('[data-chart="grad-norm-spread"]')
    plot.scroll_into_view_if_needed()
    page.wait_points("grad-norm-spread", 12)
    api = httpx.get(f"{dash.url}/api/runs/{w.run_id}/params/spread", timeout=10).json()
    drawn = p.evaluate("""() => { const el = document.querySelector('[data-chart="grad-norm-spread"]');
        const t = el.data.find((d) => d.name === 'median'); return {x: t.x, y: t.y}; }""")
    assert drawn["x"] == api["step"] and drawn["y"] == pytest.approx(api["median"], rel=1e-12)
    train(dash.url, "spread", 8, w=w, model=model, opt=opt)  # live: summarised in the browser
    w.close(timeout=30)
    page.wait_points("grad-norm-spread", 20)
    api = httpx.get(f"{dash.url}/api/runs/{w.run_id}/params/spread", timeout=10).json()
    drawn = p.evaluate("""() => { const el = document.querySelector('[data-chart="grad-norm-spread"]');
        const med = el.data.find((d) => d.name === 'median');
        const band = el.data.find((d) => d.name === 'quartiles');
        return {x: med.x, median: med.y, q75: band.y}; }""")
    assert drawn["x"] == api["step"]
    np.testing.assert_allclose(drawn["median"], api["median"], rtol=1e-6)  # float32 on the wire, float64 at rest
    np.testing.assert_allclose(drawn["q75"], api["q75"], rtol=1e-6)


def test_hovering_a_step_marks_it_on_every_chart(dash: ServerProcess, page: Page) -> None:
    w, _, _ = train(dash.url, "crosshair", 30)
    w.close(timeout=30)
    p = page.open(f"{dash.url}/runs/{w.run_id}")
    loss = p.locator('[data-chart="loss"]')
    loss.scroll_into_view_if_needed()
    box = p.evaluate("""() => { const el = document.querySelector('[data-chart="loss"]'); const xa = el._fullLayout.xaxis;
        const ya = el._fullLayout.yaxis; const r = el.getBoundingClientRect();
        return {x: r.left + xa._offset + xa.l2p(17), y: r.top + ya._offset + ya._length / 2}; }""")
    p.mouse.move(box["x"], box["y"])
    p.wait_for_function("document.querySelector('[data-chart=\"grad-norm-total\"]').dataset.crosshair === '17'")
    marked = p.evaluate("""() => [...document.querySelectorAll('[data-chart]')].filter((el) => !el.closest('[hidden]'))
        .map((el) => [el.dataset.chart, el.dataset.crosshair || null])""")
    for name, step in marked:
        assert step == "17", name  # every chart of the page, the heatmaps and the spread included
    line = p.locator('[data-chart="grad-norm-total"] .crosshair')
    assert line.is_visible()
    p.mouse.move(1, 1)
    p.wait_for_function("!document.querySelector('[data-chart=\"grad-norm-total\"]').dataset.crosshair")
    assert line.is_hidden()


NOTIFY_SPY = """
window.__notes = [];
if (window.Notification) {
  const Real = window.Notification;
  window.Notification = class extends Real {
    constructor(title, options) { super(title, options); window.__notes.push([title, options && options.body, options && options.tag]); }
  };
}
"""

HIDE = """() => { Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
    Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});
    document.dispatchEvent(new Event('visibilitychange')); }"""
SHOW = """() => { delete document.hidden; delete document.visibilityState;
    Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
    document.dispatchEvent(new Event('visibilitychange')); }"""


@pytest.mark.parametrize("turned_on", [False, True])
def test_a_background_tab_counts_findings_and_notifies_when_asked(
    dash: ServerProcess, browser: sync_api.Browser, turned_on: bool
) -> None:
    page = Page(browser)
    try:
        page.context.grant_permissions(["notifications"], origin=dash.url)
        page.context.add_init_script(NOTIFY_SPY)
        run = f"alerts-{turned_on}"
        w, model, opt = train(dash.url, run, 1, zero_grad=False)  # one step: no finding yet
        assert wait_serialized(w._sender, 10)
        p = page.open(f"{dash.url}/runs/{w.run_id}")
        toggle = p.locator("[data-notify]")
        assert toggle.get_attribute("aria-pressed") == "false"  # off by default
        if turned_on:
            toggle.click()
            sync_api.expect(toggle).to_have_attribute("aria-pressed", "true")
        p.evaluate(HIDE)
        assert p.title() == f"{run} · gradwatch"  # no findings yet: no count
        train(dash.url, run, 6, zero_grad=False, w=w, model=model, opt=opt)  # gradients pile up: an error finding
        w.close(timeout=30)
        p.wait_for_function("document.title.startsWith('(')", timeout=30_000)
        found = httpx.get(f"{dash.url}/api/runs/{w.run_id}/diagnostics", timeout=10).json()
        assert p.title() == f"({len(found)}) {run} · gradwatch"
        notes = p.evaluate("window.__notes")
        if turned_on:
            errors = {f["code"]: f for f in found if f["severity"] in ("error", "warning")}
            assert sorted(tag.rsplit("#", 1)[1] for _, _, tag in notes) == sorted(errors)  # each once
            for title, body, tag in notes:
                finding = errors[tag.rsplit("#", 1)[1]]
                assert title == f"gradwatch {finding['severity']}: {run}" and body
        else:
            assert notes == []
        p.evaluate(SHOW)
        assert p.title() == f"{run} · gradwatch"  # looked at: the plain title again
        page.page.reload()
        p.wait_for_function("document.body.dataset.ready === '1'")
        assert (p.locator("[data-notify]").get_attribute("aria-pressed") == "true") == turned_on  # kept
    finally:
        page.close()


def drawn_lines(p: sync_api.Page, chart: str) -> dict[str, Any]:
    return p.evaluate(
        """(c) => { const el = document.querySelector(`[data-chart="${c}"]`);
        const raw = el.data.find((d) => d.name === 'loss');
        const smooth = el.data.find((d) => d.name === 'loss (smoothed)');
        return {x: raw.x, opacity: raw.opacity, smooth: smooth ? {x: smooth.x, y: smooth.y} : null}; }""",
        chart,
    )


def test_smoothing_draws_the_ema_over_the_faint_raw_series_and_keeps_it_in_the_url(
    dash: ServerProcess, page: Page
) -> None:
    w, _, _ = train(dash.url, "smoothing", 40)
    w.close(timeout=30)
    raw = [
        float(v)
        for v in httpx.get(f"{dash.url}/api/runs/{w.run_id}/series", params={"key": "loss"}, timeout=10).json()["value"]
    ]
    p = page.open(f"{dash.url}/runs/{w.run_id}?smooth=0.6")
    lines = drawn_lines(p, "loss")
    assert lines["opacity"] == pytest.approx(0.3) and lines["smooth"] is not None
    np.testing.assert_allclose(lines["smooth"]["y"], reference_ema(raw, 0.6), rtol=1e-9)
    slider = p.locator("[data-smoothing]")
    assert slider.input_value() == "0.6"

    slider.fill("0.9")  # sets the value and fires input and change, as letting go of the slider does
    p.wait_for_function("new URLSearchParams(location.search).get('smooth') === '0.9'")
    p.wait_for_function(
        """(want) => { const el = document.querySelector('[data-chart="loss"]');
        const s = el.data.find((d) => d.name === 'loss (smoothed)'); return s && Math.abs(s.y[5] - want) < 1e-9; }""",
        arg=reference_ema(raw, 0.9)[5],
    )
    np.testing.assert_allclose(drawn_lines(p, "loss")["smooth"]["y"], reference_ema(raw, 0.9), rtol=1e-9)
    for chart in ("grad-norm-total", "param-grad-norm", "lr"):  # every line chart
        assert p.evaluate(
            '(c) => document.querySelector(`[data-chart="${c}"]`).data.some((d) => / \\(smoothed\\)$/.test(d.name))',
            chart,
        ), chart

    slider.fill("0")
    p.wait_for_function("!new URLSearchParams(location.search).has('smooth')")
    p.wait_for_function(
        """() => !document.querySelector('[data-chart="loss"]').data.some((d) => d.name === 'loss (smoothed)')"""
    )
    assert drawn_lines(p, "loss")["opacity"] == 1


def test_a_downsampled_chart_is_smoothed_before_downsampling(dash: ServerProcess, page: Page) -> None:
    """1,500 steps on a half-width chart: the server smooths the raw steps, then buckets them."""
    seed(dash, SyntheticRun("smooth-long", "smooth-long", total_steps=1500), 1500)
    raw = [
        float(v)
        for v in httpx.get(
            f"{dash.url}/api/runs/smooth-long/series", params={"key": "loss", "max_points": 100_000}, timeout=10
        ).json()["value"]
    ]
    want = reference_ema(raw, 0.95)
    p = page.open(f"{dash.url}/runs/smooth-long?smooth=0.95")
    lines = drawn_lines(p, "loss")
    xs = lines["x"]
    assert 100 < len(xs) < 1500  # downsampled
    assert lines["smooth"]["x"] == xs
    ends = xs[1:] + [1501]
    for j in range(0, len(xs), 37):  # each drawn point: the mean of the smoothed steps of its bucket
        bucket = want[xs[j] - 1 : ends[j] - 1]
        assert lines["smooth"]["y"][j] == pytest.approx(float(np.mean(bucket)), rel=1e-9), j


def test_compare_shows_each_runs_context_and_the_config_that_differs(dash: ServerProcess, page: Page) -> None:
    ids = []
    for lr in (0.1, 0.2):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        with gradwatch.watch(
            opt,
            model=model,
            run=f"cmp-lr{lr}",
            server=dash.url,
            warn=False,
            config={"lr": lr, "data": {"name": "same"}},
        ) as w:
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(4, 4)).sum().backward()
                opt.step()
        ids.append(w.run_id)
        ctx = w._sender.hello["run"]["config"]["context"]
    p = page.open(f"{dash.url}/compare?runs={','.join(ids)}")
    for run_id, lr in zip(ids, (0.1, 0.2)):
        row = p.locator(f'#settings tr[data-run-id="{run_id}"]')
        assert row.locator("[data-field=argv] code").inner_text() == shlex.join(sys.argv)
        assert row.locator("[data-field=host]").inner_text().startswith(ctx["host"])
        assert f"torch {torch.__version__}" in row.locator("[data-field=versions]").inner_text()
        git = row.locator("[data-field=git]").inner_text()
        assert git == "—" if not ctx["git"] else git.startswith(ctx["git"]["commit"][:10])
        chips = row.locator("[data-field=config] .chip")
        assert chips.all_inner_texts() == [f"lr {lr}"]  # data.name is the same in both: not repeated


def test_compare_smooths_every_run_with_its_slider(dash: ServerProcess, page: Page) -> None:
    ids = []
    for k in range(2):
        w, _, _ = train(dash.url, f"cmp-smooth-{k}", 25)
        w.close(timeout=30)
        ids.append(w.run_id)
    p = page.open(f"{dash.url}/compare?runs={','.join(ids)}&smooth=0.7")
    p.wait_for_function("""() => (document.querySelector('[data-chart="compare-loss"]').data || [])
        .filter((d) => / \\(smoothed\\)$/.test(d.name)).length === 2""")
    drawn = p.evaluate("""() => document.querySelector('[data-chart="compare-loss"]').data
        .filter((d) => / \\(smoothed\\)$/.test(d.name)).map((d) => d.y)""")
    for run_id, ys in zip(ids, drawn):
        raw = [
            float(v)
            for v in httpx.get(f"{dash.url}/api/runs/{run_id}/series", params={"key": "loss"}, timeout=10).json()[
                "value"
            ]
        ]
        np.testing.assert_allclose(ys, reference_ema(raw, 0.7), rtol=1e-9)
    p.locator("[data-smoothing]").fill("0")
    p.wait_for_function("!new URLSearchParams(location.search).has('smooth')")
    p.wait_for_function(
        """() => !document.querySelector('[data-chart="compare-loss"]').data.some((d) => / \\(smoothed\\)$/.test(d.name))"""
    )
