"""The dashboard in a real Chromium: the page wrapper and what the browser tests share.

The pages publish what they drew: every chart element has `data-chart="<id>"` and, once drawn,
`data-points` (points or cells) and `data-nonfinite` (NaN/Inf values shown); `body[data-ready]`
is "1" after the first full render. `Page` waits on those, never on sleeps.

Chromium: /usr/bin/chromium, or the path in GRADWATCH_CHROMIUM. Never downloaded.
The fixtures (`browser`, `dash`, `page`, `http`) are in tests/browser/conftest.py.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import httpx
import pytest
from playwright import sync_api

from support.server import ServerProcess
from support.synthetic import Ingest, SyntheticRun

XSS_NAME = "<img src=x onerror=alert(1)>"
XSS_PROJECT = "<script>alert(2)</script>"
XSS_PARAM = "<b>bold</b>.weight"
TIMEOUT_MS = 15_000
# Assertions wait as long as page calls do (Playwright's `expect` has 5 s of its own): on a
# loaded 2-core CI machine a live update can take longer than that to land.
sync_api.expect.set_options(timeout=TIMEOUT_MS)

#: Every chart of the run page, in its order.
CHARTS = [
    "grad-norm-total",
    "loss",
    "param-grad-norm",
    "grad-norm-spread",
    "grad-status",
    "grad-norm-heatmap",
    "exp-avg-norm",
    "exp-avg-sq-norm",
    "update-ratio",
    "lr",
    "memory",
]
#: What a real AdamW run with the hook draws (no update ratio yet, no CUDA on this machine).
REAL_RUN_CHARTS = [c for c in CHARTS if c != "update-ratio"]


def chromium_path() -> str:
    path = os.environ.get("GRADWATCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        pytest.fail(
            f"no Chromium at {path}: `make test` installs it (apt-get install chromium), or set GRADWATCH_CHROMIUM"
        )
    return path


class Page:
    """A page with its JS errors and dialogs recorded; fails the test on either."""

    def __init__(self, browser: sync_api.Browser, scheme: str = "light", width: int = 1400) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": 900}, color_scheme=scheme)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.foreign: list[str] = []
        self.page.on("request", self._request)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("dialog", self._dialog)

    def _request(self, request: sync_api.Request) -> None:
        """The dashboard works offline: nothing but the gradwatch server is ever asked."""
        if not re.match(r"^(https?|wss?)://127\.0\.0\.1:\d+/", request.url) and not request.url.startswith("data:"):
            self.foreign.append(request.url)

    def _dialog(self, dialog: sync_api.Dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, url: str) -> sync_api.Page:
        self.page.goto(url)
        self.page.wait_for_function("document.body.dataset.ready === '1'")
        return self.page

    def points(self, chart: str) -> int:
        return int(self.page.get_attribute(f'[data-chart="{chart}"]', "data-points") or 0)

    def nonfinite(self, chart: str) -> int:
        return int(self.page.get_attribute(f'[data-chart="{chart}"]', "data-nonfinite") or 0)

    def wait_points(self, chart: str, at_least: int) -> None:
        self.page.wait_for_function(
            '([c, n]) => +(document.querySelector(`[data-chart="${c}"]`)?.dataset.points || 0) >= n',
            arg=[chart, at_least],
        )

    def close(self) -> None:
        assert not self.dialogs, f"a dialog fired: {self.dialogs}"
        assert not self.errors, f"errors in the page: {self.errors}"
        assert not self.foreign, f"requests beyond the server: {self.foreign}"
        self.context.close()


def seed(dash: ServerProcess, run: SyntheticRun, steps: int, status: str | None = "finished") -> None:
    with Ingest(dash.ws_url, run) as hook:
        hook.steps(steps)
        if status:
            hook.close(status)


#: In /params order, modules interleaved: the heatmap must regroup them.
INTERLEAVED = [
    ("blocks.1.attn.qkv.weight", [8, 8]),
    ("head.weight", [8, 8]),
    ("blocks.0.attn.qkv.weight", [8, 8]),
    ("blocks.1.attn.qkv.bias", [8]),  # NaN where the run says (synthetic.py)
    ("blocks.0.mlp.fc1.weight", [8, 8]),
    ("scale", [1]),
    ("blocks.1.mlp.fc1.weight", [8, 8]),  # +Inf there
    ("blocks.0.attn.qkv.bias", [8]),
]
#: Grouped: each module's parameters, and its submodules', together, in order of first appearance.
GROUPED = [
    "blocks.1.attn.qkv.weight",
    "blocks.1.attn.qkv.bias",
    "blocks.1.mlp.fc1.weight",
    "blocks.0.attn.qkv.weight",
    "blocks.0.attn.qkv.bias",
    "blocks.0.mlp.fc1.weight",
    "head.weight",
    "scale",
]


def chart(p: sync_api.Page, name: str) -> sync_api.Locator:
    return p.locator(f'[data-chart="{name}"]')


#: The columns a heatmap draws (charts/heatmap.js, segments): [[step, x of its centre], ...], read
#: through the run page's test hook, window.gradwatch (frontend/js/page.js).
COLUMNS = """(c) => {
    const el = document.querySelector(`[data-chart="${c}"]`);
    const chart = Object.values(window.gradwatch.views).find((v) => v.chart && v.chart.el === el).chart;
    return chart.shown.flatMap((seg) => seg.steps.map((s, j) => [s, (seg.edges[j] + seg.edges[j + 1]) / 2]));
}"""


def hover_text(p: sync_api.Page, name: str, step: int, row: int) -> list[str]:
    """Move the mouse over the cell (step, row) of a heatmap; the hover label's lines."""
    el = chart(p, name)
    el.scroll_into_view_if_needed()
    x, y = p.evaluate(
        f"""([c, step, row]) => {{
        const el = document.querySelector(`[data-chart="${{c}}"]`);
        const fl = el._fullLayout;
        const box = el.getBoundingClientRect();
        const [, x] = ({COLUMNS})(c).find(([s]) => s === step);
        return [box.left + fl._size.l + fl.xaxis.l2p(x), box.top + fl._size.t + fl.yaxis.l2p(row)];
    }}""",
        [name, step, row],
    )
    p.mouse.move(x, y)
    label = el.locator(".hoverlayer .hovertext").first
    sync_api.expect(label).to_be_visible()
    lines = label.locator("text.nums tspan.line").all_text_contents()
    p.mouse.move(0, 0)
    return lines


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


_DRAWN_BOX = """(selector) => {
    const e = document.querySelector(selector);
    const r = e && e.getBoundingClientRect();
    return r && r.width > 0 && r.height > 0 ? {x: r.x, y: r.y, width: r.width, height: r.height} : null;
}"""


def box(p: sync_api.Page, selector: str, timeout_ms: float = 5000) -> dict[str, float]:
    """The first match's box once it is drawn, read in one evaluation in the page.

    Pages redraw whole tables and cards on refresh: a box read through a locator can resolve an
    element the next redraw has just detached, and comes back empty. One evaluation cannot be
    split by a redraw, and it is retried until the element is drawn.
    """
    try:
        return p.wait_for_function(_DRAWN_BOX, arg=selector, timeout=timeout_ms).json_value()
    except sync_api.TimeoutError:
        raise AssertionError(f"{selector} is not drawn within {timeout_ms / 1000:g} s") from None


def finding_counts(http: httpx.Client, run_id: str) -> dict[str, int]:
    found = http.get(f"/api/runs/{run_id}/diagnostics").json()
    return {sev: sum(f["severity"] == sev for f in found) for sev in ("error", "warning", "info")}
