"""The run page's heatmaps, zoom and parameter choice, in a real Chromium against a real server.

The fixtures of conftest.py (one `gradwatch serve` for the module, runs fed
as hand-built protocol v1 messages over /ws/ingest). What is checked:
- heatmap rows are grouped by module (modules in the order their first parameter appears), with
  a separator line between modules, and the hover names the parameter, the step and the value;
- a zoom fetches the window again (the API is called with start/end) and the charts then hold
  every step of the window; a newer zoom wins over an older one; zooming out goes back;
- a reversed zoom window is normalised and the y axis fits it; the zoom hint covers nothing;
- the picker shows a whole module, or the top k smallest, and the optimizer-state charts follow;
  its search box matches as the user types;
- param groups are called by their names; a findings figure says at which step it holds; other
  scalars default to one the user logged; memory starts on a log axis when RSS dwarfs the model;
  a deleted run's page says it was deleted.

Run: .venv/bin/python -m pytest tests/browser/test_run_page.py
"""

from __future__ import annotations

import base64
import math

import httpx
import numpy as np
import torch
from playwright import sync_api

import gradwatch
from support.browser import COLUMNS, GROUPED, INTERLEAVED, Page, box, chart, hover_text, scalars_run, seed
from support.server import ServerProcess
from support.synthetic import Ingest, SyntheticRun

expect = sync_api.expect


def test_heatmap_rows_are_grouped_by_module(dash: ServerProcess, page: Page) -> None:
    run = SyntheticRun("grouped", "grouped-rows", params=INTERLEAVED, nan_steps={12}, total_steps=30)
    seed(dash, run, 30)
    p = page.open(dash.url + "/runs/grouped")
    for name in ("grad-norm-heatmap", "grad-status"):
        chart(p, name).scroll_into_view_if_needed()
        page.wait_points(name, len(GROUPED) * 30)
        rows = p.evaluate('c => document.querySelector(`[data-chart="${c}"]`).data[0].y', name)
        assert rows == GROUPED, name
        # Separators between the modules two levels down: blocks.1 | blocks.0 | head | (top level).
        lines = p.evaluate(
            """c => document.querySelector(`[data-chart="${c}"]`).layout.shapes
            .filter((s) => s.name === 'module-separator').map((s) => s.y0)""",
            name,
        )
        assert lines == [2.5, 5.5, 6.5], name
        assert chart(p, name).get_attribute("data-modules") == "4"
        # Every row is tall enough for its name: the y axis lists them, in the grouped order.
        ticks = chart(p, name).locator(".ytick text").all_text_contents()
        assert sorted(ticks) == sorted(GROUPED) and len(ticks) == len(GROUPED)
    assert page.nonfinite("grad-norm-heatmap") == 2  # NaN and +Inf at step 12, drawn in their own colour

    # Hover names the parameter, the step and the value (the stored float32, 4 significant digits).
    want = grads_at(INTERLEAVED, 30, 20)["blocks.0.mlp.fc1.weight"]
    assert hover_text(p, "grad-norm-heatmap", 20, GROUPED.index("blocks.0.mlp.fc1.weight")) == [
        "blocks.0.mlp.fc1.weight",
        f"step 20: {significant(want)}",
    ]
    nan_row = GROUPED.index("blocks.1.attn.qkv.bias")
    assert hover_text(p, "grad-norm-heatmap", 12, nan_row) == ["blocks.1.attn.qkv.bias", "step 12: NaN"]
    assert hover_text(p, "grad-status", 12, nan_row) == ["blocks.1.attn.qkv.bias", "step 12: nonfinite"]


def significant(v: float) -> str:
    """What d3's ".4~g" writes for a value around 0.01..1000."""
    digits = 4 - 1 - math.floor(math.log10(abs(v)))
    return f"{round(v, digits):.{max(digits, 0)}f}".rstrip("0").rstrip(".")


def test_zoom_fetches_the_window_at_full_resolution(dash: ServerProcess, page: Page) -> None:
    steps = 1500  # more than the loss chart's pixels across: its overview is downsampled
    run = SyntheticRun("zoomed", "zoom-run", params=INTERLEAVED[:4], total_steps=steps)
    seed(dash, run, steps)
    requests: list[str] = []
    page.page.on("request", lambda r: requests.append(r.url) if "/api/runs/zoomed/" in r.url else None)
    # An older zoom's answers are made to arrive last: they must not be drawn (start=601: see below).
    page.page.add_init_script("""{
        const fetch0 = window.fetch;
        window.__heldBack = [];
        window.__heldBackSettled = 0;
        window.fetch = (url, opts) => {
            if (!String(url).includes('start=601&')) return fetch0(url, opts);
            window.__heldBack.push(String(url));
            // settled: its body is in, or the page aborted it (the zoom's AbortController)
            return new Promise((r) => setTimeout(r, 1500))
                .then(() => fetch0(url, opts))
                .then(async (answer) => { await answer.clone().arrayBuffer(); return answer; })
                .finally(() => { window.__heldBackSettled += 1; });
        };
    }""")
    p = page.open(dash.url + "/runs/zoomed")
    overview = loss_steps(p)
    assert len(overview) < steps / 2, "the overview should be downsampled for this test to mean anything"

    # A drag on the loss chart from step ~800 to ~1000, as a person zooms.
    drag(p, "loss", 800, 1000)
    a, b = zoom_window(p)
    assert 780 <= a <= 820 and 980 <= b <= 1020, (a, b)
    assert any(f"/series?key=loss&start={a}&end={b}&" in u for u in requests), requests
    assert loss_steps(p, a, b) == list(range(a, b + 1))  # every step of the window
    assert loss_steps(p, 1, a - 1), "outside the window the overview still shows"
    shared = dict(kv.split("=") for kv in p.url.split("?", 1)[1].split("&"))  # the zoom, rounded
    assert abs(int(shared["from"]) - a) <= 1 and abs(int(shared["to"]) - b) <= 1, p.url

    # The heatmap (out of view) fetches the window once scrolled to, and draws each of its steps
    # as a column.
    heat = chart(p, "grad-norm-heatmap")
    heat.scroll_into_view_if_needed()
    sync_api.expect(heat).to_have_attribute("data-window", f"{a}-{b}")
    assert any(f"/heatmap?metric=grad_norm&start={a}&end={b}&" in u for u in requests), requests
    columns = [s for s, _ in p.evaluate(COLUMNS, "grad-norm-heatmap")]
    assert [s for s in columns if a <= s <= b] == list(range(a, b + 1))
    chart(p, "loss").scroll_into_view_if_needed()

    # A zoom overtaken by a newer one: its late answers are dropped, the newer window stays.
    set_zoom(p, 600.6, 700.4)  # steps 601-700: answers held back 1.5 s
    # Conditions, not times (a loaded machine takes longer than any fixed wait): its loss request
    # is out, then the newer zoom is drawn, then every held-back answer has reached the page (or
    # was aborted by it) and two frames have been drawn since.
    p.wait_for_function("window.__heldBack.some((u) => u.includes('/series?key=loss&start=601&end=700&'))")
    set_zoom(p, 1100.6, 1200.4)  # steps 1101-1200
    p.wait_for_function("document.body.dataset.zoom === '1101-1200'")
    p.wait_for_function("window.__heldBackSettled === window.__heldBack.length")
    p.evaluate("new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r))))")
    assert p.evaluate("document.body.dataset.zoom") == "1101-1200"
    assert chart(p, "loss").get_attribute("data-window") == "1101-1200"
    assert loss_steps(p, 1101, 1200) == list(range(1101, 1201))
    assert not loss_steps(p, 601, 700) or len(loss_steps(p, 601, 700)) < 100

    # Double-click: back to the whole run, downsampled as before.
    area = box(p, '[data-chart="loss"] .nsewdrag')
    p.mouse.dblclick(area["x"] + area["width"] / 2, area["y"] + area["height"] / 2)
    p.wait_for_function("document.body.dataset.zoom === 'all'")
    assert loss_steps(p) == overview
    assert chart(p, "loss").get_attribute("data-window") is None
    assert "from=" not in p.url


def loss_steps(p: sync_api.Page, a: float = -math.inf, b: float = math.inf) -> list[int]:
    """The steps the loss chart's line holds in [a, b]."""
    xs = p.evaluate("""() => document.querySelector('[data-chart="loss"]').data
        .find((t) => t.mode && t.mode.startsWith('lines') && t.hoverinfo !== 'skip').x""")
    return [x for x in xs if a <= x <= b]


def drag(p: sync_api.Page, name: str, x0: float, x1: float) -> None:
    """Drag across a chart's plot area from step x0 to step x1 (Plotly's zoom box)."""
    el = chart(p, name)
    el.scroll_into_view_if_needed()
    px = p.evaluate(
        """([c, x0, x1]) => {
        const el = document.querySelector(`[data-chart="${c}"]`);
        const fl = el._fullLayout;
        const box = el.getBoundingClientRect();
        const y = box.top + fl._size.t + fl._size.h / 2;
        return [box.left + fl._size.l + fl.xaxis.l2p(x0), box.left + fl._size.l + fl.xaxis.l2p(x1), y];
    }""",
        [name, x0, x1],
    )
    p.mouse.move(px[0], px[2])
    p.mouse.down()
    p.mouse.move((px[0] + px[1]) / 2, px[2], steps=4)
    p.mouse.move(px[1], px[2], steps=4)
    p.mouse.up()


def set_zoom(p: sync_api.Page, a: float, b: float) -> None:
    """Zoom as Plotly reports a zoom box: a relayout of the loss chart's x range."""
    p.evaluate(
        """([a, b]) => window.Plotly.relayout(document.querySelector('[data-chart="loss"]'),
        {'xaxis.range[0]': a, 'xaxis.range[1]': b})""",
        [a, b],
    )


def zoom_window(p: sync_api.Page) -> tuple[int, int]:
    """Wait until every chart shows the zoomed window; its first and last step."""
    p.wait_for_function("/^\\d+-\\d+$/.test(document.body.dataset.zoom || '')")
    a, b = p.evaluate("document.body.dataset.zoom").split("-")
    return int(a), int(b)


#: Two modules of four and three parameters, and more.
MODULES = [
    ("embed.weight", [16, 8]),
    ("blocks.0.attn.qkv.weight", [24, 8]),
    ("blocks.0.attn.qkv.bias", [24]),
    ("blocks.0.mlp.fc1.weight", [32, 8]),
    ("blocks.0.mlp.fc2.weight", [8, 32]),
    ("blocks.1.attn.qkv.weight", [24, 8]),
    ("blocks.1.mlp.fc1.weight", [32, 8]),
    ("blocks.1.mlp.fc2.weight", [8, 32]),
    ("head.weight", [16, 8]),
]


def test_picker_shows_a_whole_module_and_the_top_k_smallest(dash: ServerProcess, page: Page) -> None:
    run = SyntheticRun("modules", "module-choice", params=MODULES, total_steps=25)
    seed(dash, run, 25)
    p = page.open(dash.url + "/runs/modules")
    modules = p.locator('[data-role="module"] option').evaluate_all("els => els.map((e) => e.value)")
    assert modules == [
        "",
        "embed",
        "blocks",
        "blocks.0",
        "blocks.0.attn",
        "blocks.0.attn.qkv",
        "blocks.0.mlp",
        "blocks.0.mlp.fc1",
        "blocks.0.mlp.fc2",
        "blocks.1",
        "blocks.1.attn",
        "blocks.1.attn.qkv",
        "blocks.1.mlp",
        "blocks.1.mlp.fc1",
        "blocks.1.mlp.fc2",
        "head",
    ]

    # A whole module: every parameter under the prefix, in the gradient norms and the moments.
    p.select_option('[data-role="module"]', "blocks.0")
    want = [n for n, _ in MODULES if n.startswith("blocks.0.")]
    sync_api.expect(p.locator(".chip-name")).to_have_text(want)
    p.wait_for_function(
        """n => +document.querySelector('[data-chart="param-grad-norm"]').dataset.series === n
        && +document.querySelector('[data-chart="exp-avg-norm"]').dataset.series === n""",
        arg=len(want),
    )
    names = p.evaluate("""() => document.querySelector('[data-chart="exp-avg-norm"]').data
        .filter((t) => t.showlegend !== false && t.mode !== 'markers').map((t) => t.name)""")
    assert names == want
    assert page.points("param-grad-norm") == 25 * len(want)
    assert "module=blocks.0" in p.url
    help_text = p.locator('[data-card="param-grad-norm"] .card-help')
    sync_api.expect(help_text).to_contain_text("module blocks.0: 4 parameters")

    # The URL keeps it.
    p = page.open(p.url)
    sync_api.expect(p.locator(".chip-name")).to_have_text(want)
    assert p.locator('[data-role="module"]').input_value() == "blocks.0"

    # The top 3 smallest at the last step.
    p.fill(".picker-top input", "3")
    p.select_option(".picker-top select", "asc")
    last = grads_at(MODULES, 25, 25)
    smallest = [n for n, _ in sorted(last.items(), key=lambda kv: kv[1])[:3]]
    sync_api.expect(p.locator(".chip-name")).to_have_text(smallest)
    assert "order=asc" in p.url and "top=3" in p.url and "module=" not in p.url
    p.wait_for_function("""() => +document.querySelector('[data-chart="exp-avg-norm"]').dataset.series === 3""")


def grads_at(params: list[tuple[str, list[int]]], total: int, step: int) -> dict[str, float]:
    """Each parameter's gradient norm at `step`, as the synthetic run sends it (float32)."""
    msg = SyntheticRun("x", "x", params=params, total_steps=total).step(step, step)
    grads = np.frombuffer(base64.b64decode(msg["params"]["grad_norm"]), dtype="<f4")
    return {name: float(g) for (name, _), g in zip(params, grads)}


def test_module_grouping_rules(dash: ServerProcess, page: Page) -> None:
    """modules.js, the pure functions behind the grouping and the module choice."""
    p = page.open(dash.url + "/")
    got = p.evaluate("""async () => {
        const m = await import('/static/js/modules.js');
        const names = ['scale', 'enc.1.w', 'dec.w', 'enc.0.a.w', 'bias', 'enc.1.b', 'enc.0.a.b', 'enc.0.w', 'dec.b'];
        const order = m.moduleOrder(names).map((i) => names[i]);
        return {
            order,
            kept: m.moduleOrder(['a.x', 'a.y', 'b.x']),  // already grouped: unchanged
            depth1: m.moduleGroups(order, 1).map((g) => [g.module, g.start, g.end]),
            coarse: m.coarseGroups(order, 5).depth,
            fine: m.coarseGroups(order, 100).depth,
            list: m.moduleList(names).map((x) => `${x.path}:${x.count}`),
            of: ['a.b.c.weight', 'weight'].map(m.moduleOf),
            params: m.moduleParams(names, 'enc.0'),
            prefixOnly: m.moduleParams(['enc.0.w', 'enc.01.w'], 'enc.0'),
        };
    }""")
    assert got == {
        # Top-level parameters are in no module: they keep their place among the modules.
        "order": ["scale", "enc.1.w", "enc.1.b", "enc.0.a.w", "enc.0.a.b", "enc.0.w", "dec.w", "dec.b", "bias"],
        "kept": [0, 1, 2],
        "depth1": [["", 0, 1], ["enc", 1, 6], ["dec", 6, 8], ["", 8, 9]],
        "coarse": 2,  # depth 2: 5 groups (enc.1, enc.0 apart); depth 3: 6 (enc.0.a apart from enc.0.w)
        "fine": 3,
        "list": ["enc:5", "enc.1:2", "enc.0:3", "enc.0.a:2", "dec:2"],
        "of": ["a.b.c", ""],
        "params": ["enc.0.a.w", "enc.0.a.b", "enc.0.w"],
        "prefixOnly": ["enc.0.w"],
    }


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
