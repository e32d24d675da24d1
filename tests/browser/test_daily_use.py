"""What a user trips on in a day's use of the dashboard (issue 20's fixes), in a real Chromium
against a real `gradwatch serve` fed over /ws/ingest (synthetic.py; the fixtures of conftest.py).

Run: .venv/bin/python -m pytest tests/browser/test_daily_use.py
"""

from __future__ import annotations

import math

import httpx
import torch
from playwright import sync_api

import gradwatch
from support.browser import Page, seed
from support.server import ServerProcess
from support.synthetic import Ingest, SyntheticRun

expect = sync_api.expect


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
    return p.evaluate('c => document.querySelector(`[data-chart="${c}"]`)._fullLayout.yaxis.range.slice()', chart)


def test_zoom_normalises_a_reversed_window_and_fits_y_to_it(
    dash: ServerProcess, page: Page, http: httpx.Client
) -> None:
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
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


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


def test_run_list_at_800_px_never_scrolls_the_page_sideways(dash: ServerProcess, browser: sync_api.Browser) -> None:
    seed(dash, SyntheticRun("narrow-1", "a-rather-long-run-name-for-a-narrow-window", project="narrow"), 3)
    seed(dash, SyntheticRun("narrow-2", "another", project="narrow"), 3)
    narrow = Page(browser, width=800)
    try:
        p = narrow.open(dash.url + "/?project=narrow")
        expect(p.locator("#runs tbody tr")).to_have_count(2)
        widths = p.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in an {widths[1]} px window"
        # Every run is still reachable: its link is in view, and the table scrolls inside its card.
        link = box(p, 'tr[data-run-id="narrow-1"] .run-link')
        assert link["x"] >= 0 and link["x"] + 10 <= widths[1]
        wrap = p.evaluate("""() => { const w = document.querySelector('#runs .table-wrap');
            return [w.scrollWidth, w.clientWidth, getComputedStyle(w).overflowX]; }""")
        assert wrap[0] <= wrap[1] or wrap[2] in ("auto", "scroll")
    finally:
        narrow.close()


def test_tags_filter_the_run_list_and_the_filter_is_shown(dash: ServerProcess, page: Page, http: httpx.Client) -> None:
    for run_id, tags in (("tagged-a", ["sweep", "baseline"]), ("tagged-b", ["sweep"]), ("tagged-c", [])):
        seed(dash, SyntheticRun(run_id, run_id, project="tags"), 2)
        assert http.patch(f"/api/runs/{run_id}", json={"tags": tags}).status_code == 200
    p = page.open(dash.url + "/?project=tags")
    rows = p.locator("#runs tbody tr")
    expect(rows).to_have_count(3)
    # A visible tag control in the toolbar, with every tag of the runs.
    select = p.locator("#filter-tag-select")
    expect(select).to_be_visible()
    assert select.locator("option").all_text_contents() == ["Any tag", "tag: baseline", "tag: sweep"]
    select.select_option("sweep")
    expect(rows).to_have_count(2)
    expect(p.locator("#filter-tag")).to_contain_text("only runs tagged")
    expect(p.locator("#filter-tag .chip-name")).to_have_text("sweep")
    assert "tag=sweep" in p.url
    expect(p.locator('tr[data-run-id="tagged-a"] .tag[data-tag="sweep"]')).to_have_attribute("aria-pressed", "true")
    # A tag chip in a row is a filter too, and the toolbar follows it.
    p.locator('tr[data-run-id="tagged-a"] .tag[data-tag="baseline"]').click()
    expect(rows).to_have_count(1)
    expect(select).to_have_value("baseline")
    expect(p.locator("#filter-tag .chip-name")).to_have_text("baseline")
    p.get_by_role("button", name="Stop filtering by tag baseline").click()
    expect(rows).to_have_count(3)
    expect(select).to_have_value("")
    expect(p.locator("#filter-tag")).to_have_count(0)


class NamedGroupsRun(SyntheticRun):
    """A synthetic run whose two param groups are both named, as a user's optimizer can name them."""

    def hello(self) -> dict[str, object]:
        message = super().hello()
        message["groups"][0]["name"] = "decay"  # type: ignore[index]
        return message


def test_param_groups_are_called_by_their_names_everywhere(dash: ServerProcess, page: Page) -> None:
    seed(dash, NamedGroupsRun("groups-a", "groups-a", project="groups", total_steps=30), 30)
    seed(dash, SyntheticRun("groups-b", "groups-b", project="groups", total_steps=30), 20)  # group 0 unnamed
    p = page.open(dash.url + "/runs/groups-a")
    p.locator('[data-chart="lr"]').scroll_into_view_if_needed()
    page.wait_points("lr", 60)
    names = p.evaluate("""() => document.querySelector('[data-chart="lr"]').data
        .filter(t => t.hoverinfo !== 'skip').map(t => t.name)""")
    assert names == ["decay", "no_decay"]

    # Compare: every group's learning rate, matched by name; a group one run lacks says so by being empty.
    p = page.open(dash.url + "/compare?runs=groups-a,groups-b")
    p.wait_for_function("document.body.dataset.drawn === 'step:overlay'")
    cards = p.locator('[data-card^="compare-lr"]')
    expect(cards.locator("h2")).to_have_text(
        ["Learning rate · decay", "Learning rate · no_decay", "Learning rate · group 0"]
    )
    assert page.points("compare-lr") == 30  # decay: run a only
    assert page.points("compare-lr-1") == 50  # no_decay: both runs
    assert page.points("compare-lr-2") == 20  # run b's unnamed group 0
    expect(p.locator('#settings tr[data-run-id="groups-a"] [data-field="lr"] .lr')).to_have_text(
        ["decay 3.00e-4", "no_decay 3.00e-4"]
    )


def test_a_findings_figure_says_at_which_step_it_holds(dash: ServerProcess, page: Page) -> None:
    """A loop that never calls zero_grad(): the finding's figure (backward passes summed) is the
    count at the step where it was found, and says so, while the run goes on summing."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model, run="no-zero-grad", project="findings", server=dash.url, warn=False)
    for _ in range(12):
        model(torch.randn(8, 4)).pow(2).mean().backward()  # no zero_grad(): .grad piles up
        opt.step()
    w.close(timeout=30)
    p = page.open(f"{dash.url}/runs/{w.run_id}")
    row = p.locator('.findings .finding[data-code="grad_accumulation_unbounded"]')
    expect(row.locator(".finding-step")).to_have_text(" · from step 2")
    expect(row.locator(".finding-figure-value")).to_have_text("2")
    expect(row.locator(".finding-figure-step")).to_have_text("at step 2")
    expect(p.locator('[data-field="steps"]')).to_have_text("12")  # the run went on past it


class ScalarsRun(SyntheticRun):
    """A synthetic run that also logs `extra` scalars (a step's value: the step number)."""

    extra: tuple[str, ...] = ()

    def step(self, seq: int, step: int) -> dict[str, object]:
        message = super().step(seq, step)
        message["scalars"].update({k: float(step) for k in self.extra})  # type: ignore[attr-defined]
        return message


def scalars_run(run_id: str, params: list[str], extra: tuple[str, ...]) -> ScalarsRun:
    run = ScalarsRun(run_id, run_id, project="defaults", total_steps=10, params=[(n, [4, 4]) for n in params])
    run.extra = extra
    return run


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


def test_other_scalars_default_to_one_the_user_logged(dash: ServerProcess, page: Page) -> None:
    seed(dash, scalars_run("other-user", ["w", "b"], ("backward_passes", "val_acc")), 10)
    p = page.open(dash.url + "/runs/other-user")
    expect(p.locator('[data-card="other-scalars"] select')).to_have_value("val_acc")
    p.locator('[data-chart="other-scalars"]').scroll_into_view_if_needed()
    page.wait_points("other-scalars", 10)
    names = p.evaluate("""() => document.querySelector('[data-chart="other-scalars"]').data.map(t => t.name)""")
    assert names == ["val_acc"]


def test_a_deleted_runs_page_says_it_was_deleted(dash: ServerProcess, page: Page, http: httpx.Client) -> None:
    seed(dash, SyntheticRun("doomed", "doomed", total_steps=5), 5)
    seed(dash, SyntheticRun("kept", "kept", total_steps=5), 5)
    assert http.delete("/api/runs/doomed").status_code == 204
    p = page.page
    p.goto(dash.url + "/runs/doomed")
    expect(p.locator("#page-notice .notice-title")).to_have_text("This run was deleted")
    expect(p.locator("#page-notice")).to_contain_text("doomed")
    assert p.evaluate("document.body.dataset.state") == "deleted"
    assert p.locator("#charts").is_hidden()

    # An id the server never had: it may yet arrive (watch() prints it first), or never existed.
    p.goto(dash.url + "/runs/never-was")
    expect(p.locator("#page-notice .notice-title")).to_have_text("Waiting for this run")
    expect(p.locator("#page-notice")).to_contain_text("or it never existed")

    p.goto(dash.url + "/compare?runs=kept,doomed")
    p.wait_for_function("document.body.dataset.ready === '1'")
    expect(p.locator(".compare-run").nth(1)).to_contain_text("doomed was deleted")
    # The browser's own console line for each 404 answer, and nothing else.
    assert all("status of 404" in e for e in page.errors), page.errors
    page.errors.clear()


def test_memory_starts_on_a_log_axis_when_rss_dwarfs_the_model(dash: ServerProcess, page: Page) -> None:
    """A small model's parameters, gradients and optimizer state beside the process RSS: on a
    linear axis they sit at 0; the memory chart starts on a log axis, which the toggle can leave."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    w = gradwatch.watch(opt, model=model, run="memory-log", project="memory", server=dash.url, warn=False)
    for _ in range(6):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    w.close(timeout=30)
    p = page.open(f"{dash.url}/runs/{w.run_id}")
    chart = p.locator('[data-chart="memory"]')
    chart.scroll_into_view_if_needed()
    page.wait_points("memory", 6)
    traces = chart.evaluate("el => el.data.filter(t => t.hoverinfo !== 'skip').map(t => [t.name, Math.max(...t.y)])")
    peaks = dict(traces)
    assert peaks["process RSS"] > 100 * peaks["parameters"], peaks
    assert chart.evaluate("el => el._fullLayout.yaxis.type") == "log"
    box = p.locator('[data-card="memory"] .toggle input')
    expect(box).to_be_checked()
    box.uncheck()
    p.wait_for_function("""() => document.querySelector('[data-chart="memory"]')._fullLayout.yaxis.type === 'linear'""")
