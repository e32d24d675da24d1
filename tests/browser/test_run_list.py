"""The run list in a real Chromium against a real `gradwatch serve` (runs fed over /ws/ingest as
protocol v1 messages, synthetic.py; the fixtures of conftest.py): sort, filters (tags), findings
counts, edit (name, tags), delete, the token of a guarded server, and a narrow window.

Each test seeds runs into a project of its own and opens the list filtered to it, so the
module's tests share one server without seeing each other's runs. The pages publish what they
drew (see tests/support/browser.py); the tests wait on that, never on sleeps.

Run: .venv/bin/python -m pytest tests/browser/test_run_list.py
"""

from __future__ import annotations

import json

import httpx
import pytest
from playwright import sync_api
from websockets.sync.client import connect

from support.browser import XSS_NAME, Page, box, finding_counts, seed
from support.server import REPO, ServerProcess, start_server
from support.synthetic import SyntheticRun

expect = sync_api.expect


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
