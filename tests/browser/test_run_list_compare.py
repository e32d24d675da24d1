"""The run list's sort, selection, edit (name, tags) and delete, and the compare page's settings
table, layouts, alignment and parameters matched by name: real Chromium, a real `gradwatch
serve`, runs fed over /ws/ingest as protocol v1 messages (synthetic.py).

Each test seeds runs into a project of its own and opens the list filtered to it, so the
module's tests share one server without seeing each other's runs. The pages publish what they
drew (see tests/support/browser.py); the compare page also sets body[data-drawn] to "<x>:<layout>"
once a view is drawn. The tests wait on those, never on sleeps.
"""

from __future__ import annotations

import json

import httpx
import pytest
from playwright import sync_api  # noqa: E402  (installed by `make test`)
from websockets.sync.client import connect

from support.browser import XSS_NAME, Page
from support.server import REPO, ServerProcess, start_server
from support.synthetic import Ingest, SyntheticRun, _shapes

expect = sync_api.expect


def seed(server: ServerProcess, run: SyntheticRun, steps: int) -> None:
    with Ingest(server.ws_url, run) as hook:
        hook.steps(steps)
        hook.close("finished")


def row(p: sync_api.Page, run_id: str) -> sync_api.Locator:
    return p.locator(f'tr[data-run-id="{run_id}"]')


def listed_ids(p: sync_api.Page) -> list[str]:
    return p.locator("#runs tbody tr").evaluate_all("els => els.map(e => e.dataset.runId)")


def refused(page: Page, status: int) -> None:
    """The server refused a write on purpose: Chromium logs that as a console error, which
    Page.close would otherwise report; every other error still fails the test."""
    line = f"the server responded with a status of {status}"
    assert any(line in e for e in page.errors), page.errors
    page.errors[:] = [e for e in page.errors if line not in e]


def finding_counts(http: httpx.Client, run_id: str) -> dict[str, int]:
    found = http.get(f"/api/runs/{run_id}/diagnostics").json()
    return {sev: sum(f["severity"] == sev for f in found) for sev in ("error", "warning", "info")}


# -- run list -------------------------------------------------------------------------------------


def test_sort_by_column_changes_the_order_and_stays_in_the_url(dash: ServerProcess, page: Page) -> None:
    t = 1_700_000_000.0
    seed(dash, SyntheticRun("sort-b", "bravo", project="sorting", started_at=t + 2), 5)
    seed(dash, SyntheticRun("sort-a", "Alpha", project="sorting", started_at=t + 1), 12)
    seed(dash, SyntheticRun("sort-c", "charlie", project="sorting", started_at=t + 3), 8)
    p = page.open(dash.url + "/?project=sorting")
    expect(p.locator("#runs tbody tr")).to_have_count(3)
    assert listed_ids(p) == ["sort-c", "sort-b", "sort-a"]  # newest first by default

    p.click('button[data-sort="name"]')
    assert listed_ids(p) == ["sort-a", "sort-b", "sort-c"]  # case does not matter
    assert "sort=name" in p.url and "dir=asc" in p.url
    p.click('button[data-sort="name"]')
    assert listed_ids(p) == ["sort-c", "sort-b", "sort-a"]
    assert "dir=desc" in p.url

    p.click('button[data-sort="steps"]')
    assert listed_ids(p) == ["sort-a", "sort-c", "sort-b"]  # 12, 8, 5
    expect(p.locator('th:has(button[data-sort="steps"])')).to_have_attribute("aria-sort", "descending")
    assert "sort=steps" in p.url and "dir=desc" in p.url

    # The keyboard works the same (a real button), and keeps its focus on it.
    p.focus('button[data-sort="steps"]')
    p.keyboard.press("Enter")
    assert listed_ids(p) == ["sort-b", "sort-c", "sort-a"]
    assert p.evaluate("document.activeElement.dataset.sort") == "steps"

    # The URL holds the view: opened again, it sorts the same.
    p = page.open(p.url)
    expect(p.locator("#runs tbody tr")).to_have_count(3)
    assert listed_ids(p) == ["sort-b", "sort-c", "sort-a"]
    expect(p.locator('th:has(button[data-sort="steps"])')).to_have_attribute("aria-sort", "ascending")
    p.click('button[data-sort="project"]')  # all the same project: ties are newest first
    assert listed_ids(p) == ["sort-c", "sort-b", "sort-a"]


def test_findings_counts_match_the_diagnostics_api(dash: ServerProcess, page: Page, http: httpx.Client) -> None:
    seed(dash, SyntheticRun("fc-nan", "with-nan", project="counting", nan_steps={8}, total_steps=20), 20)
    seed(dash, SyntheticRun("fc-plain", "plain", project="counting", total_steps=20), 20)
    expected = {run_id: finding_counts(http, run_id) for run_id in ("fc-nan", "fc-plain")}
    assert expected["fc-nan"]["error"] == 1 and expected["fc-nan"]["warning"] >= 1  # NaN; adapter.weight
    assert expected["fc-plain"]["error"] == 0
    p = page.open(dash.url + "/?project=counting")
    for run_id, counts in expected.items():
        cell = row(p, run_id).locator(".col-findings")
        expect(cell).to_have_attribute("data-errors", str(counts["error"]))
        expect(cell).to_have_attribute("data-warnings", str(counts["warning"]))
        expect(cell).to_have_attribute("data-info", str(counts["info"]))
    expect(row(p, "fc-nan").locator(".fcount-error")).to_have_text("1 error")
    assert row(p, "fc-plain").locator(".fcount-error").count() == 0
    warnings = expected["fc-plain"]["warning"]
    expect(row(p, "fc-plain").locator(".fcount-warning")).to_have_text(
        f"{warnings} warning{'s' if warnings > 1 else ''}"
    )


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


def test_rename_and_tags_round_trip_as_text(dash: ServerProcess, page: Page, http: httpx.Client) -> None:
    seed(dash, SyntheticRun("edit-me", "before", project="editing", total_steps=10), 10)
    seed(dash, SyntheticRun("edit-other", "other", project="editing", total_steps=10), 10)
    p = page.open(dash.url + "/?project=editing")
    row(p, "edit-me").get_by_role("button", name="Edit").click()
    dialog = p.locator("#edit-dialog")
    expect(dialog).to_be_visible()
    expect(p.locator("#edit-name")).to_be_focused()
    expect(p.locator("#edit-name")).to_have_value("before")

    # The server's refusal is shown in the dialog, which stays open.
    p.fill("#edit-tags", "x" * 65)
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.locator(".dialog-error")).to_contain_text("at most 64 characters")
    expect(dialog).to_be_visible()
    refused(page, 422)

    p.fill("#edit-name", "after")
    p.fill("#edit-tags", f"baseline, {XSS_NAME} , baseline")
    p.keyboard.press("Enter")  # submits the form
    expect(dialog).to_be_hidden()
    expect(row(p, "edit-me").locator(".run-link")).to_have_text("after")
    expect(row(p, "edit-me").locator(".tag")).to_have_text(["baseline", XSS_NAME])
    assert p.locator("img[src='x']").count() == 0
    run = http.get("/api/runs/edit-me").json()
    assert (run["name"], run["tags"]) == ("after", ["baseline", XSS_NAME])

    p.reload()
    p.wait_for_function("document.body.dataset.ready === '1'")
    expect(row(p, "edit-me").locator(".run-link")).to_have_text("after")
    expect(row(p, "edit-me").locator(".tag")).to_have_text(["baseline", XSS_NAME])
    assert p.locator("#runs img").count() == 0

    # A tag is a filter (kept in the URL), and the text filter finds tags too.
    row(p, "edit-me").locator(".tag", has_text="baseline").click()
    expect(p.locator("#runs tbody tr")).to_have_count(1)
    assert "tag=baseline" in p.url
    p.get_by_role("button", name="Stop filtering by tag baseline").click()
    expect(p.locator("#runs tbody tr")).to_have_count(2)
    p.fill("#filter-text", "onerror")
    expect(p.locator("#runs tbody tr")).to_have_count(1)
    p.fill("#filter-text", "")

    # Tags can be cleared, and Escape leaves without saving.
    row(p, "edit-me").get_by_role("button", name="Edit").click()
    expect(p.locator("#edit-tags")).to_have_value(f"baseline, {XSS_NAME}")
    p.fill("#edit-name", "not saved")
    p.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(row(p, "edit-me").get_by_role("button", name="Edit")).to_be_focused()  # back where it was
    assert http.get("/api/runs/edit-me").json()["name"] == "after"
    row(p, "edit-me").get_by_role("button", name="Edit").click()
    p.fill("#edit-tags", "")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(row(p, "edit-me").locator(".tag")).to_have_count(0)
    assert http.get("/api/runs/edit-me").json()["tags"] == []


def test_delete_asks_first(dash: ServerProcess, page: Page, http: httpx.Client) -> None:
    seed(dash, SyntheticRun("doomed", "doomed-run", project="deleting", total_steps=10), 10)
    seed(dash, SyntheticRun("kept", "kept-run", project="deleting", total_steps=10), 10)
    p = page.open(dash.url + "/?project=deleting")
    dialog = p.locator("#delete-dialog")

    row(p, "doomed").get_by_role("button", name="Delete").click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("doomed-run")
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()  # the safe choice first
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    expect(p.locator("#runs tbody tr")).to_have_count(2)
    assert http.get("/api/runs/doomed").status_code == 200

    row(p, "doomed").get_by_role("button", name="Delete").click()
    p.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    assert http.get("/api/runs/doomed").status_code == 200

    row(p, "doomed").get_by_role("button", name="Delete").click()
    dialog.get_by_role("button", name="Delete").click()
    expect(dialog).to_be_hidden()
    expect(p.locator("#runs tbody tr")).to_have_count(1)
    assert listed_ids(p) == ["kept"]
    assert http.get("/api/runs/doomed").status_code == 404
    p.reload()
    p.wait_for_function("document.body.dataset.ready === '1'")
    assert listed_ids(p) == ["kept"]


def test_writes_ask_for_the_token_of_a_guarded_server(
    browser: sync_api.Browser, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = start_server(
        tmp_path_factory.mktemp("guarded"), token="s3cret", env={"GRADWATCH_FRONTEND_DIR": str(REPO / "frontend")}
    )
    page = Page(browser)
    try:
        run = SyntheticRun("guarded", "guarded-run", total_steps=5)
        with connect(f"{server.ws_url}/ws/ingest", additional_headers={"Authorization": "Bearer s3cret"}) as ws:
            ws.send(json.dumps(run.hello()))
            assert json.loads(ws.recv(10))["type"] == "welcome"
        p = page.open(server.url + "/")
        row(p, "guarded").get_by_role("button", name="Edit").click()
        p.fill("#edit-tags", "secured")
        p.locator("#edit-dialog").get_by_role("button", name="Save").click()
        expect(p.locator("#edit-dialog .dialog-error")).to_have_text("This server needs its token.")
        expect(p.locator("#edit-dialog-token")).to_be_focused()
        refused(page, 401)
        p.fill("#edit-dialog-token", "wrong")
        p.locator("#edit-dialog").get_by_role("button", name="Save").click()
        expect(p.locator("#edit-dialog .dialog-error")).to_have_text("The server refused this token.")
        refused(page, 401)
        p.fill("#edit-dialog-token", "s3cret")
        p.locator("#edit-dialog").get_by_role("button", name="Save").click()
        expect(p.locator("#edit-dialog")).to_be_hidden()
        expect(row(p, "guarded").locator(".tag")).to_have_text(["secured"])
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/api/runs/guarded").json()["tags"] == ["secured"]
        # The token is kept for the tab: the delete goes through without asking again.
        row(p, "guarded").get_by_role("button", name="Delete").click()
        p.locator("#delete-dialog").get_by_role("button", name="Delete").click()
        expect(p.locator("#runs tbody tr")).to_have_count(0)
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/api/runs/guarded").status_code == 404
    finally:
        page.close()
        server.stop()


# -- compare ----------------------------------------------------------------------------------------


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
