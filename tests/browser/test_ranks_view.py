"""A distributed run in a real Chromium against a real `gradwatch serve`: the run list's world-size
badge, the run page's Ranks section, a rank's own page; and jobs of 48 and 1,024 ranks, whose Ranks
section draws the spread across its ranks (quantile bands, the outlier ranks) instead of a line
per rank (the 1,024-rank job written through the store: support/bigjob.py).

The job is two ranks, each streaming hand-built protocol v1 messages over its own websocket
(support/synthetic_dist.py): rank 1 is the straggler (its forward pass takes five times as long)
and its connection drops after step 37 while rank 0 goes on to step 60. The charts' values are
compared with what each rank sent.

Run: .venv/bin/python -m pytest tests/browser/test_ranks_view.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from playwright import sync_api

from gradwatch_server.store import open_store
from support.bigjob import fill_job
from support.bigjob import rank_scalars as big_rank_scalars
from support.browser import Page, seed
from support.server import REPO, ServerProcess, start_server
from support.synthetic import Ingest, SyntheticRun
from support.synthetic_dist import RankRun, rank_runs, send_job

JOB = "ddpjob"
STEPS, LOST_AFTER = 60, 37
RANK_CHARTS = {
    "rank-step-time": "time/step_s",
    "rank-before-backward": "time/before_backward_s",
    "rank-memory": "mem/cuda:{rank}/allocated",
    "rank-grad-norm": "grad_norm_total",
}

#: What a chart holds, as drawn: each series' name, steps and values (before any unit scaling).
SERIES = """(c) => {
    const el = document.querySelector(`[data-chart="${c}"]`);
    const chart = Object.values(window.gradwatch.views).find((v) => v.chart && v.chart.el === el).chart;
    return chart.series.map((s) => ({name: s.name, x: s.x, y: s.y}));
}"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[RankRun]]]:
    server = start_server(
        tmp_path_factory.mktemp("ranks-view"),
        env={"GRADWATCH_FRONTEND_DIR": str(REPO / "frontend")},
        args=("--rank-timeout", "1"),
    )
    try:
        ranks = rank_runs(JOB, "ddp-two-ranks", 2, straggler=1)
        send_job(server.ws_url, ranks, STEPS, lost={1: LOST_AFTER})
        seed(server, SyntheticRun("solo", "single-process", params=ranks[0].params), 12)
        wait_done(server.url, JOB, STEPS)
        yield server, ranks
    finally:
        server.stop()


def wait_done(url: str, job: str, steps: int, timeout_s: float = 30.0) -> None:
    """Until the job's run has `steps` steps and is no longer running (its lost ranks timed out)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        run = httpx.get(f"{url}/api/runs/{job}", timeout=10).json()
        if run.get("steps") == steps and run.get("status") != "running":
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job} was not assembled in {timeout_s} s")


def test_run_list_badges_the_job_and_hides_its_ranks(dist: tuple[ServerProcess, list[RankRun]], page: Page) -> None:
    p = page.open(dist[0].url + "/")
    row = p.locator(f'tr[data-run-id="{JOB}"]')
    sync_api.expect(row.locator(".ranks-badge")).to_have_text("2 ranks")
    sync_api.expect(p.locator('tr[data-run-id="solo"] .ranks-badge')).to_have_count(0)
    assert p.locator(f'tr[data-run-id^="{JOB}.r"]').count() == 0


def test_ranks_section_draws_a_line_per_rank_with_what_each_sent(
    dist: tuple[ServerProcess, list[RankRun]], page: Page
) -> None:
    ranks = dist[1]
    p = page.open(dist[0].url + f"/runs/{JOB}")
    card = p.locator('[data-card="ranks"]')
    sync_api.expect(card).to_be_visible()
    sync_api.expect(p.locator('[data-field="ranks"]')).to_have_text("2")

    # One row per rank, each linking to its own run; rank 1 is named lost.
    rows = card.locator("tbody tr")
    sync_api.expect(rows).to_have_count(2)
    sync_api.expect(card.locator('tr[data-rank="1"]')).to_have_attribute("data-lost", "1")
    sync_api.expect(card.locator('tr[data-rank="0"]')).to_have_attribute("data-lost", "")
    links = card.locator("a.rank-link").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert links == [f"/runs/{JOB}.r0", f"/runs/{JOB}.r1"]

    # The partial steps and the lost rank, in words.
    notice = card.locator(".ranks-notice")
    sync_api.expect(notice).to_contain_text("steps 38-60 are missing rank 1")
    sync_api.expect(notice).to_contain_text("Rank 1 was lost: rank 1 sent nothing after step 37")
    assert notice.get_attribute("data-partial-steps") == str(STEPS - LOST_AFTER)

    # Four charts, two lines each, the values each rank sent at each of its steps.
    for chart, key in RANK_CHARTS.items():
        el = p.locator(f'[data-chart="{chart}"]')
        el.scroll_into_view_if_needed()
        page.wait_points(chart, STEPS + LOST_AFTER)
        drawn = p.evaluate(SERIES, chart)
        assert [s["name"].split(" ")[:2] for s in drawn] == [["rank", "0"], ["rank", "1"]], chart
        for rank, series in zip(ranks, drawn, strict=True):
            sent_key = key.format(rank=rank.rank)
            steps = sorted(rank.sent)
            assert series["x"] == steps, chart
            if chart == "rank-grad-norm":
                want = [float(rank.sent[s]["grad_norm_total"]) for s in steps]
            else:
                want = [float(rank.sent[s][sent_key]) for s in steps]
            assert series["y"] == pytest.approx(want, rel=1e-12), chart
        if chart == "rank-memory":
            assert el.get_attribute("data-keys") == "mem/cuda:0/allocated,mem/cuda:1/allocated"

    # The job's own charts shade the partial steps (a band from 38 to 60, named on hover).
    for chart in ("grad-norm-total", "loss"):
        p.wait_for_function(
            """c => JSON.stringify((document.querySelector(`[data-chart="${c}"]`).layout.shapes || [])
            .filter((s) => s.type === 'rect').map((s) => [s.x0, s.x1])) === '[[37.5,60.5]]'""",
            arg=chart,
        )

    # The straggler stands apart in time before backward.
    sync_api.expect(card).to_have_attribute("data-straggler", "1")
    sync_api.expect(card.locator(".ranks-straggler")).to_contain_text("Rank 1 is the straggler")


def test_a_ranks_page_names_its_job_and_links_back(dist: tuple[ServerProcess, list[RankRun]], page: Page) -> None:
    p = page.open(dist[0].url + f"/runs/{JOB}")
    p.locator(f'a.rank-link[href="/runs/{JOB}.r1"]').click()
    p.wait_for_url(f"**/runs/{JOB}.r1")
    p.wait_for_function("document.body.dataset.ready === '1'")
    rank = p.locator('[data-field="rank"]')
    sync_api.expect(rank).to_have_text(f"1 of 2 in job {JOB}")
    sync_api.expect(rank.locator("a.job-link")).to_have_attribute("href", f"/runs/{JOB}")
    # The rank's own charts: its 37 steps; no Ranks section on a rank's page.
    sync_api.expect(p.locator('[data-field="steps"]')).to_have_text(str(LOST_AFTER))
    page.wait_points("grad-norm-total", LOST_AFTER)
    assert p.locator('[data-card="ranks"]').is_hidden()
    sync_api.expect(p.locator(".findings-ok")).to_contain_text("a rank's own run is not diagnosed")
    rank.locator("a.job-link").click()
    p.wait_for_url(f"**/runs/{JOB}")
    sync_api.expect(p.locator('[data-card="ranks"]')).to_be_visible()


def test_a_single_process_run_has_no_ranks_section(dist: tuple[ServerProcess, list[RankRun]], page: Page) -> None:
    p = page.open(dist[0].url + "/runs/solo")
    page.wait_points("grad-norm-total", 12)
    for card in ("ranks", *RANK_CHARTS):
        assert p.locator(f'[data-card="{card}"]').is_hidden(), card
    assert p.locator('[data-field="ranks"], [data-field="rank"]').count() == 0


def test_a_big_job_draws_eight_ranks_and_takes_another_choice(
    dist: tuple[ServerProcess, list[RankRun]], page: Page
) -> None:
    server = dist[0]
    big = "bigjob"
    send_job(server.ws_url, rank_runs(big, "twelve-ranks", 12), 10, lost={11: 5})
    wait_done(server.url, big, 10)  # rank 11 lost: the page's choice of ranks is settled
    requests: list[str] = []
    page.page.on("request", lambda r: requests.append(r.url))
    p = page.open(server.url + f"/runs/{big}")
    sync_api.expect(p.locator('[data-card="ranks"] tbody tr')).to_have_count(12)
    # Rank 0, the lost rank 11, and the lowest others: 8 lines a chart, one request each.
    for chart in RANK_CHARTS:
        p.wait_for_function(
            "c => document.querySelector(`[data-chart=\"${c}\"]`).dataset.ranks === '0,1,2,3,4,5,6,11'", arg=chart
        )
    # Each load of the page (it may load twice: its live socket can open before the first load
    # ends) asks for the 8 ranks' series of each chart and, once, each drawn rank's metric names.
    asked = [u for u in requests if f"/api/runs/{big}.r" in u]
    series = [(u.split("/")[5], parse_qs(urlsplit(u).query)["key"][0]) for u in asked if "/series?" in u]
    assert len(set(series)) == 4 * 8, series
    assert len({u for u in asked if u.endswith("/metrics")}) == 8
    assert not any(f"{big}.r{r}/" in u for u in asked for r in (7, 8, 9, 10))

    # Another choice, kept in the URL.
    pick = p.locator('[data-card="ranks"] input[aria-label="Ranks to draw"]')
    sync_api.expect(pick).to_have_value("0,1,2,3,4,5,6,11")
    pick.fill("8-10")
    pick.press("Enter")
    p.wait_for_function("() => document.querySelector('[data-chart=\"rank-step-time\"]').dataset.ranks === '8,9,10'")
    page.wait_points("rank-step-time", 30)
    assert "ranks=8%2C9%2C10" in p.url or "ranks=8,9,10" in p.url
    names = [s["name"] for s in p.evaluate(SERIES, "rank-step-time")]
    assert names == ["rank 8", "rank 9", "rank 10"]


def test_the_ranks_section_follows_a_running_job(dist: tuple[ServerProcess, list[RankRun]], page: Page) -> None:
    server = dist[0]
    ranks = rank_runs("livejob", "live-ranks", 2)
    hooks = [Ingest(server.ws_url, r) for r in ranks]
    try:
        for hook in hooks:
            hook.steps(5)
        p = page.open(server.url + "/runs/livejob")
        page.wait_points("rank-step-time", 10)
        for hook in hooks:
            hook.steps(5)
        # The job's live steps bring the ranks' new steps within the refresh period (5 s).
        page.wait_points("rank-step-time", 20)
        for hook in hooks:
            hook.close("finished")
        # The job's new status brings it within the refresh period too: up to 5 s after the load
        # that the last steps made, itself a moment ago, then a fetch and a render.
        badge = p.locator('[data-card="ranks"] tr[data-rank="1"] .badge')
        sync_api.expect(badge).to_have_text("finished", timeout=15_000)
    finally:
        for hook in hooks:
            hook.__exit__(None, None, None)


def test_a_rank_that_never_came_is_named(dist: tuple[ServerProcess, list[RankRun]], page: Page) -> None:
    server = dist[0]
    send_job(server.ws_url, rank_runs("twoofthree", "two-of-three", 3)[:2], 5)
    p = page.open(server.url + "/runs/twoofthree")
    card = p.locator('[data-card="ranks"]')
    sync_api.expect(card.locator("tbody tr")).to_have_count(2)
    sync_api.expect(card.locator(".ranks-notice li[data-absent]")).to_have_text("Rank 2 has not reached this server.")


#: A job past SMALL_JOB_RANKS (frontend/js/ranks.js): its Ranks section draws the spread.
BIG_JOB, BIG_RANKS, BIG_STEPS, BIG_STRAGGLER = "bigjob", 48, 6, 7


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[RankRun]]]:
    server = start_server(
        tmp_path_factory.mktemp("ranks-view-big"),
        env={"GRADWATCH_FRONTEND_DIR": str(REPO / "frontend")},
        args=("--rank-timeout", "30"),
    )
    try:
        ranks = rank_runs(BIG_JOB, "forty-eight-ranks", BIG_RANKS, straggler=BIG_STRAGGLER)
        send_job(server.ws_url, ranks, BIG_STEPS)
        wait_done(server.url, BIG_JOB, BIG_STEPS)
        yield server, ranks
    finally:
        server.stop()


#: What a chart holds with its bands: each series' name, steps, values and band edges.
BANDS = """(c) => {
    const el = document.querySelector(`[data-chart="${c}"]`);
    const chart = Object.values(window.gradwatch.views).find((v) => v.chart && v.chart.el === el).chart;
    return chart.series.map((s) => ({name: s.name, x: s.x, y: s.y, min: s.min, max: s.max}));
}"""


def test_a_big_jobs_ranks_section_draws_quantile_bands_and_names_the_outlier(
    big: tuple[ServerProcess, list[RankRun]], page: Page, tmp_path: Path
) -> None:
    """48 ranks: no line per rank but, per chart, bands across the ranks (min-max and p5-p95
    around the median) of what they sent at each step (oracle: statistics.quantiles), and the
    straggler named as the outlier of its times; the screenshot is kept in the test's folder."""
    server, ranks = big
    p = page.open(server.url + f"/runs/{BIG_JOB}")
    card = p.locator('[data-card="ranks"]')
    sync_api.expect(card.locator("tbody tr")).to_have_count(BIG_RANKS)
    sync_api.expect(card.locator(".ranks-pick")).to_be_hidden()
    for chart, key in RANK_CHARTS.items():
        p.locator(f'[data-chart="{chart}"]').scroll_into_view_if_needed()
        page.wait_points(chart, 2 * BIG_STEPS)
        bands = p.evaluate(BANDS, chart)
        assert [b["name"] for b in bands] == ["ranks: min–max (line: median)", "ranks: p5–p95"], chart
        for i, step in enumerate(range(1, BIG_STEPS + 1)):
            sent = sorted(float(r.sent[step][key.format(rank=r.rank)]) for r in ranks)
            cuts = statistics.quantiles(sent, n=20, method="inclusive")
            drawn = [bands[0]["min"][i], bands[1]["min"][i], bands[0]["y"][i], bands[1]["max"][i], bands[0]["max"][i]]
            assert drawn == pytest.approx([sent[0], cuts[0], cuts[9], cuts[18], sent[-1]], rel=1e-9), (chart, step)
            assert bands[0]["x"][i] == step
    before = p.locator('[data-chart="rank-before-backward"]')
    assert before.get_attribute("data-outliers") == str(BIG_STRAGGLER)
    outliers = p.locator('[data-card="rank-before-backward"] .rank-outliers')
    sync_api.expect(outliers).to_contain_text(f"rank {BIG_STRAGGLER} above")
    sync_api.expect(card.locator(".ranks-straggler")).to_contain_text(f"Rank {BIG_STRAGGLER} is the straggler")
    memory = p.locator('[data-chart="rank-memory"]')
    assert memory.get_attribute("data-outliers") == ""  # memory grows evenly with the rank: no outlier
    shot = tmp_path / "ranks-48.png"
    card.scroll_into_view_if_needed()
    p.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


#: A job of 1,024 ranks, written through the store (support/bigjob.py: streaming it takes minutes
#: on a small machine), its last rank gone for the last HUGE_LOST steps.
HUGE_JOB, HUGE_RANKS, HUGE_STEPS, HUGE_LOST = "hugejob", 1024, 8, 2


@pytest.fixture(scope="module")
def huge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("ranks-view-huge")
    store = open_store(f"sqlite:///{tmp / 'huge.db'}")
    try:
        fill_job(
            store,
            HUGE_JOB,
            HUGE_RANKS,
            [("fc.weight", [4, 4]), ("fc.bias", [4])],
            HUGE_STEPS,
            rank_rows=2,
            lost=HUGE_LOST,
        )
    finally:
        store.close()
    server = start_server(tmp, db_path=tmp / "huge.db", env={"GRADWATCH_FRONTEND_DIR": str(REPO / "frontend")})
    try:
        yield server
    finally:
        server.stop()


def test_a_1024_rank_jobs_run_page_draws_the_spread_and_names_the_straggler(
    huge: ServerProcess, page: Page, tmp_path: Path
) -> None:
    """1,024 ranks: the Ranks section lists them, names the partial steps, draws per chart the
    bands across the ranks of what each sent (oracle: statistics.quantiles of bigjob's
    `rank_scalars`) and names the straggler; the screenshot is kept in the test's folder."""
    p = page.open(huge.url + f"/runs/{HUGE_JOB}")
    card = p.locator('[data-card="ranks"]')
    sync_api.expect(card.locator("tbody tr")).to_have_count(HUGE_RANKS)
    sync_api.expect(card.locator(".ranks-notice")).to_contain_text(
        f"steps {HUGE_STEPS - HUGE_LOST + 1}-{HUGE_STEPS} are missing rank {HUGE_RANKS - 1}"
    )
    for chart, key in RANK_CHARTS.items():
        p.locator(f'[data-chart="{chart}"]').scroll_into_view_if_needed()
        page.wait_points(chart, 2 * HUGE_STEPS)
        bands = p.evaluate(BANDS, chart)
        assert [b["name"] for b in bands] == ["ranks: min–max (line: median)", "ranks: p5–p95"], chart
        for i, step in enumerate(range(1, HUGE_STEPS + 1)):
            present = HUGE_RANKS - (1 if step > HUGE_STEPS - HUGE_LOST else 0)
            sent = sorted(big_rank_scalars(r, step)[key.format(rank=r % 8)] for r in range(present))
            cuts = statistics.quantiles(sent, n=20, method="inclusive")
            drawn = [bands[0]["min"][i], bands[1]["min"][i], bands[0]["y"][i], bands[1]["max"][i], bands[0]["max"][i]]
            assert drawn == pytest.approx([sent[0], cuts[0], cuts[9], cuts[18], sent[-1]], rel=1e-9), (chart, step)
    assert p.locator('[data-chart="rank-before-backward"]').get_attribute("data-outliers") == str(BIG_STRAGGLER)
    sync_api.expect(card.locator(".ranks-straggler")).to_contain_text(f"Rank {BIG_STRAGGLER} is the straggler")
    shot = tmp_path / "ranks-1024.png"
    card.scroll_into_view_if_needed()
    p.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
