"""How the run page loads and draws (issue #5), in a real Chromium against a real server.

The fixtures of conftest.py. What is checked:
- run.html preloads every module the page imports, and no other (no browser needed);
- the charts in view draw first; those below the fold ask for their data once Plotly is there,
  and draw without being scrolled to; a chart scrolled to draws before those out of view;
- each chart draws once while the page loads: one Plotly.react, and margins that Plotly's
  automargin did not have to grow (which costs a second draw);
- the heatmaps' float32 cells (?encoding=f32, grid.js) show exactly what the JSON cells show:
  the same hover text for values, NaN, +Inf and each status; grid.js keeps NaN, ±Inf, -0.0 and
  the empty cell apart bit for bit;
- the heatmaps' cells (painted by charts/raster.js) take the theme's colours for a status, NaN
  and an exact zero, and take the dark theme's once it is switched to;
- a line chart's legend (HTML, charts/legend.js) hides and shows a series on a click.

Run: .venv/bin/python -m pytest tests/browser/test_run_page_loading.py
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright import sync_api

from support.browser import CHARTS, GROUPED, INTERLEAVED, Page, chart, hover_text, seed
from support.server import REPO, ServerProcess
from support.synthetic import SyntheticRun

FRONTEND = REPO / "frontend"

#: Counts each chart's full draws (Plotly.react / newPlot) by its data-chart name, from the
#: moment Plotly sets window.Plotly.
COUNT_DRAWS = """
window.__draws = {};
let plotly;
Object.defineProperty(window, 'Plotly', {configurable: true, get: () => plotly, set: (P) => {
  plotly = P;
  for (const name of ['react', 'newPlot']) {
    const draw = P[name];
    P[name] = function (gd, ...rest) {
      const key = gd && gd.dataset && gd.dataset.chart;
      if (key) window.__draws[key] = (window.__draws[key] || 0) + 1;
      return draw.call(this, gd, ...rest);
    };
  }
}});
"""

#: Each chart's `gradwatch:drawn:<name>` mark (its first draw with data), ms from navigation.
DRAWN_AT = """() => Object.fromEntries(performance.getEntriesByType('mark')
    .filter((m) => m.name.startsWith('gradwatch:drawn:')).map((m) => [m.name.slice(16), m.startTime]))"""

#: When each request whose URL contains `part` started, ms from navigation.
ASKED_AT = """(part) => performance.getEntriesByType('resource').filter((e) => e.name.includes(part))
    .map((e) => e.startTime)"""


def imports_of(start: Path) -> set[str]:
    """Every module `start` imports, directly or not, itself included, as /static/ paths."""
    seen: set[Path] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for dep in re.findall(r'^import\s[^;]*?\sfrom\s+"(\.[^"]+)";', path.read_text(), re.M):
            todo.append((path.parent / dep).resolve())
    return {"/static/" + p.relative_to(FRONTEND).as_posix() for p in seen}


def test_run_html_preloads_every_module_of_the_page() -> None:
    html = (FRONTEND / "run.html").read_text()
    preloaded = re.findall(r'<link rel="modulepreload" href="([^"]+)">', html)
    scripts = re.findall(r'<script type="module"[^>]* src="([^"]+)">', html)
    scripts += re.findall(r'<script type="module">import \{ init \} from "([^"]+)"; init\(\);</script>', html)
    assert scripts == ["/static/js/pages/run-first.js", "/static/js/pages/run.js"]
    wanted = set().union(*(imports_of(FRONTEND / s.removeprefix("/static/")) for s in scripts))
    assert len(preloaded) == len(set(preloaded)), "a module is preloaded twice"
    assert set(preloaded) == wanted


@pytest.fixture
def short(browser: sync_api.Browser) -> Iterator[Page]:
    """A page whose view holds the first row of charts only (1400 x 500)."""
    p = Page(browser)
    p.page.set_viewport_size({"width": 1400, "height": 500})
    yield p
    p.close()


def test_charts_in_view_draw_first_and_the_rest_without_scrolling(dash: ServerProcess, short: Page) -> None:
    seed(dash, SyntheticRun("load-order", "load-order", nan_steps={30}, total_steps=60), 60)
    p = short.open(dash.url + "/runs/load-order")  # ready: every chart drawn, nothing scrolled
    drawn = p.evaluate(DRAWN_AT)
    assert set(drawn) == set(CHARTS), drawn
    first = ["grad-norm-total", "loss"]
    below = [c for c in CHARTS if c not in first and c != "param-grad-norm"]
    assert max(drawn[c] for c in first) < min(drawn[c] for c in below), drawn
    # Every chart's data is asked for before Plotly is compiled (the server answers meanwhile),
    # what the charts in view need first, and each once.
    plotly = p.evaluate("performance.getEntriesByName('gradwatch:plotly')[0].startTime")
    assert plotly < min(drawn.values())
    near = max(p.evaluate(ASKED_AT, "/series?key=loss") + p.evaluate(ASKED_AT, "/series?key=grad_norm_total"))
    for part in (
        "/heatmap?metric=grad_status",
        "/heatmap?metric=grad_norm",
        "/series?key=lr%2F0",
        "/params/series?metric=exp_avg_norm",
    ):
        asked = p.evaluate(ASKED_AT, part)
        assert len(asked) == 1 and near <= asked[0] < plotly, (part, asked, near, plotly)
    assert p.evaluate("window.scrollY") == 0


def test_a_chart_scrolled_to_draws_before_those_out_of_view(dash: ServerProcess, short: Page) -> None:
    seed(dash, SyntheticRun("scrolled", "scrolled", total_steps=40), 40)
    held: list[sync_api.Route] = []
    short.page.route("**/api/runs/scrolled/metrics", lambda route: held.append(route))
    short.page.goto(dash.url + "/runs/scrolled")
    short.page.wait_for_selector('[data-card="memory"]', state="attached")
    while not held:
        short.page.wait_for_timeout(20)
    # Scrolled to the bottom while the page waits for the run's metric names: the last charts
    # are in view when the views load.
    short.page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    held[0].continue_()
    short.page.wait_for_function("document.body.dataset.ready === '1'")
    drawn = short.page.evaluate(DRAWN_AT)
    assert set(drawn) == set(CHARTS), drawn
    assert drawn["memory"] < drawn["grad-norm-total"] and drawn["lr"] < drawn["grad-norm-total"], drawn


def test_each_chart_draws_once_while_the_page_loads(dash: ServerProcess, page: Page) -> None:
    seed(dash, SyntheticRun("draw-once", "draw-once", nan_steps={30}, total_steps=60), 60)
    page.page.add_init_script(COUNT_DRAWS)
    p = page.open(dash.url + "/runs/draw-once")
    draws = p.evaluate("window.__draws")
    assert draws == {name: 1 for name in CHARTS}, draws
    grown = p.evaluate("""() => [...document.querySelectorAll('[data-chart]')].filter((el) => el._fullLayout)
        .flatMap((el) => ['l', 'r', 't', 'b']
            .filter((k) => Math.abs(el._fullLayout._size[k] - el.layout.margin[k]) > 1)
            .map((k) => `${el.dataset.chart} ${k}: ${el.layout.margin[k]} -> ${el._fullLayout._size[k]}`))""")
    assert grown == [], f"automargin grew a margin (a second draw): {grown}"


def heatmap_hovers(p: sync_api.Page) -> list[list[str]]:
    """Hover texts of a few cells of both heatmaps: a value, NaN, +Inf, each status."""
    cells = [
        ("grad-norm-heatmap", 20, GROUPED.index("blocks.0.mlp.fc1.weight")),
        ("grad-norm-heatmap", 12, GROUPED.index("blocks.1.attn.qkv.bias")),
        ("grad-norm-heatmap", 12, GROUPED.index("blocks.1.mlp.fc1.weight")),
        ("grad-norm-heatmap", 5, GROUPED.index("head.weight")),
        ("grad-status", 12, GROUPED.index("blocks.1.attn.qkv.bias")),
        ("grad-status", 7, GROUPED.index("scale")),
    ]
    return [hover_text(p, name, step, row) for name, step, row in cells]


def test_float32_heatmap_cells_show_what_json_cells_show(dash: ServerProcess, page: Page) -> None:
    seed(dash, SyntheticRun("f32-cells", "f32-cells", params=INTERLEAVED, nan_steps={12}, total_steps=30), 30)
    responses: list[sync_api.Response] = []
    page.page.on("response", lambda r: responses.append(r) if "/heatmap?" in r.url else None)
    p = page.open(dash.url + "/runs/f32-cells")
    for name in ("grad-norm-heatmap", "grad-status"):
        chart(p, name).scroll_into_view_if_needed()
        page.wait_points(name, len(GROUPED) * 30)
    answers = [r.json() for r in responses]
    assert answers and all(a["z"] is None and isinstance(a["z_f32"], str) for a in answers)
    f32 = heatmap_hovers(p)
    assert f32[1][1] == "step 12: NaN" and f32[2][1] == "step 12: +Inf" and f32[4][1] == "step 12: nonfinite"
    counts = [page.nonfinite(n) for n in ("grad-norm-heatmap", "grad-status")]

    # The same page, its heatmaps asked for in JSON (as a server without f32 answers).
    page.page.route("**/heatmap?*", lambda route: route.continue_(url=route.request.url.replace("&encoding=f32", "")))
    responses.clear()
    p = page.open(dash.url + "/runs/f32-cells")
    for name in ("grad-norm-heatmap", "grad-status"):
        chart(p, name).scroll_into_view_if_needed()
        page.wait_points(name, len(GROUPED) * 30)
    answers = [r.json() for r in responses]
    assert answers and all(isinstance(a["z"], list) and "z_f32" not in a for a in answers)
    assert heatmap_hovers(p) == f32
    assert [page.nonfinite(n) for n in ("grad-norm-heatmap", "grad-status")] == counts


def f32(*bits: int) -> str:
    return base64.b64encode(struct.pack(f"<{len(bits)}I", *bits)).decode()


def test_grid_cells_keep_every_float_apart(dash: ServerProcess, page: Page) -> None:
    """grid.js: the f32 cells and the JSON cells give the same bits; merging keeps the rule."""
    empty, nan, inf, ninf, neg_zero, one_half = 0x7FC00001, 0x7FC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x3FC00000
    p = page.open(dash.url + "/")
    got = p.evaluate(
        """async ([b64, json]) => {
        const g = await import('/static/js/grid.js');
        const bits = (cells) => Array.from(g.bitsOf(cells));
        const res = {params: ['a', 'b', 'c'], step: [1, 2]};
        const fromF32 = g.gridCells({...res, z: null, z_f32: b64}, false);
        const fromJson = g.gridCells({...res, z: json}, false);
        const cols = g.gridColumns(fromF32, 2, [2, 0, 1]);
        const merged = g.mergeColumns(cols[0], cols[1], false);
        const status = g.gridCells({...res, z: [['nonzero', null], ['none', 'nonfinite'], ['zero', 'zero']]}, true);
        const live = g.liveColumn(['NaN', null, 2.5], [2, 1, 0, undefined], false);
        return {f32: bits(fromF32), json: bits(fromJson), cols: cols.map(bits), merged: bits(merged),
                status: Array.from(status), live: bits(live)};
    }""",
        [f32(one_half, empty, nan, inf, ninf, neg_zero), [[1.5, None], ["NaN", "Infinity"], ["-Infinity", -0.0]]],
    )
    assert got["f32"] == got["json"] == [one_half, empty, nan, inf, ninf, neg_zero]
    # Rows in the order asked (c, a, b), a column per step.
    assert got["cols"] == [[ninf, one_half, nan], [neg_zero, empty, inf]]
    # Merged: -Inf (non-finite) wins over -0.0; a value over empty; NaN wins over +Inf (first non-finite).
    assert got["merged"] == [ninf, one_half, nan]
    assert got["status"][0] == 2 and got["status"][2:] == [0, 3, 1, 1]
    assert got["live"] == [0x40200000, empty, nan, empty]  # 2.5, null, "NaN", a row the step lacks


def test_legend_hides_and_shows_a_series(dash: ServerProcess, page: Page) -> None:
    seed(dash, SyntheticRun("legend", "legend", total_steps=30), 30)
    p = page.open(dash.url + "/runs/legend")
    legend = chart(p, "lr").locator(".chart-legend .legend-item")
    sync_api.expect(legend).to_have_text(["group 0", "no_decay"])
    visible = "() => document.querySelector('[data-chart=\"lr\"]').data.filter((t) => t.hoverinfo !== 'skip').map((t) => t.visible)"
    assert p.evaluate(visible) == [True, True]
    legend.nth(1).click()
    sync_api.expect(legend.nth(1)).to_have_attribute("aria-pressed", "false")
    p.wait_for_function(f"({visible})().join() === 'true,false'")
    legend.nth(1).click()
    p.wait_for_function(f"({visible})().join() === 'true,true'")
    # The plot starts below the legend: its top margin holds it.
    top = p.evaluate("""() => { const el = document.querySelector('[data-chart="lr"]');
        return [el.querySelector('.chart-legend').offsetHeight, el._fullLayout._size.t]; }""")
    assert top[1] >= top[0] > 0, top


#: The colour of cell (row, column) of a heatmap's image (layout.images[0], a pixel per cell
#: unless rows have a gap), and the colour the CSS variable `name` holds now, as [r, g, b, a].
CELL_COLOUR = """async ([c, row, column, name]) => {
    const el = document.querySelector(`[data-chart="${c}"]`);
    const img = new Image();
    img.src = el.layout.images[0].source;
    await img.decode();
    const canvas = Object.assign(document.createElement('canvas'), {width: img.width, height: img.height});
    const ctx = canvas.getContext('2d', {willReadFrequently: true});
    ctx.drawImage(img, 0, 0);
    const rowPx = img.height / el.data[0].y.length;
    const cell = [...ctx.getImageData(column, Math.floor(row * rowPx), 1, 1).data];
    ctx.fillStyle = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    ctx.fillRect(0, 0, 1, 1);
    return [cell, [...ctx.getImageData(0, 0, 1, 1).data]];
}"""


def test_heatmap_cells_take_the_theme_colours(dash: ServerProcess, page: Page) -> None:
    """The cells painted in the heatmaps' images: a status, NaN and an exact zero in the theme's
    colours; switching to the dark theme paints them again in its colours."""
    seed(
        dash,
        SyntheticRun(
            "cell-colours",
            "cell-colours",
            params=INTERLEAVED + [("pos_emb.weight", [4, 4])],
            nan_steps={12},
            total_steps=30,
        ),
        30,
    )
    p = page.open(dash.url + "/runs/cell-colours")
    rows = GROUPED + ["pos_emb.weight"]
    nan_row, zero_row, ok_row = (
        rows.index("blocks.1.attn.qkv.bias"),
        rows.index("pos_emb.weight"),
        rows.index("head.weight"),
    )
    checks = [
        ("grad-status", ok_row, 0, "--status-nonzero"),
        ("grad-status", nan_row, 11, "--status-nonfinite"),
        ("grad-status", zero_row, 0, "--status-zero"),
        ("grad-norm-heatmap", nan_row, 11, "--nonfinite"),
        ("grad-norm-heatmap", zero_row, 0, "--zero"),
    ]
    for scheme in ("light", "dark"):
        if scheme == "dark":
            sources = "() => ['grad-status', 'grad-norm-heatmap'].map((c) => document.querySelector(`[data-chart=\"${c}\"]`).layout.images[0].source)"
            before = p.evaluate(sources)
            p.emulate_media(color_scheme="dark")
            p.wait_for_function(f"b => ({sources})().every((s, i) => s !== b[i])", arg=before)
        for name, row, column, var in checks:
            cell, want = p.evaluate(CELL_COLOUR, [name, row, column, var])
            assert cell == want, (scheme, name, rows[row], var)
