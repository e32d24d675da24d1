"""The run page, live, when the flight recorder's late norms arrive (frontend/js/pages/run.js,
`flush`): steps drawn without their gradient norms get them in a batch of resent steps
(`flight/resent`); the page fetches its series again and draws the late norms at their steps,
with the marker of the finding they raise."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from playwright.sync_api import expect

from support.browser import Page
from support.server import ServerProcess
from support.wiremsg import Hook, hello, steps

PARAMS = ("enc.weight", "enc.bias", "head.weight")
SPIKE_AT = 40


def norms(numbers: range, spike_at: int | None = None) -> np.ndarray:
    """Steps x parameters of steady norms with a little noise; enc.weight's 50x at `spike_at`."""
    noise = np.array([1.0 + 0.02 * ((n * 7) % 5 - 2) for n in numbers])
    out = np.stack([0.5 * noise, 0.2 * noise, 0.3 * noise], axis=1).astype("<f4")
    if spike_at in numbers:
        out[numbers.index(spike_at), 0] *= 50
    return out


def plotted(p: Any, param: str) -> dict[int, float]:
    """The per-parameter chart's points of `param`'s line: step -> value."""
    xy = p.evaluate(
        """(name) => {
        const t = document.querySelector('[data-chart="param-grad-norm"]').data
            .find((t) => t.name === name && t.hoverinfo !== 'skip');
        return t ? t.x.map((x, i) => [x, t.y[i]]) : [];
    }""",
        param,
    )
    return {int(x): float(y) for x, y in xy if y is not None}


def test_the_late_norms_are_drawn_at_their_steps_with_the_findings_marker(dash: ServerProcess, page: Page) -> None:
    """30 measured steps, then 10 sent with their loss only (every=10, a flush between), then the
    recorder's window: steps 34-40 again with their norms, a 50x spike of enc.weight at 40. The
    open page draws the values sent at 34-40 (none there before) and the spike's marker at 40."""
    measured, cheap, late = range(1, 31), range(31, 41), range(SPIKE_AT - 6, SPIKE_AT + 1)
    with Hook(dash.ws_url) as hook:
        assert hook.call(hello("late-page", params=PARAMS, config={"every": 10}))["type"] == "welcome"
        message = steps(
            1,
            measured,
            scalars={"loss": [1.0] * len(measured)},
            arrays={"grad_norm": norms(measured)},
            grad_status=[[2, 2, 2]] * len(measured),
        )
        assert hook.call(message)["type"] == "ack"
        assert hook.call(steps(2, cheap, scalars={"loss": [1.0] * len(cheap)}))["type"] == "ack"
        p = page.open(f"{dash.url}/runs/late-page")
        expect(p.locator(".live")).to_have_text("Live")
        p.wait_for_function("""() => document.querySelector('[data-chart="loss"]').dataset.points === '40'""")
        drawn = plotted(p, "enc.weight")
        assert sorted(drawn) == list(measured)  # nothing at the steps sent without their norms

        sent = norms(late, SPIKE_AT)
        resent = steps(
            3,
            late,
            scalars={"loss": [1.0] * len(late), "flight/resent": [1.0] * len(late)},
            arrays={"grad_norm": sent},
        )
        assert hook.call(resent) == {"type": "ack", "seq": 3, "linger": pytest.approx(0.25)}
        assert [(f["code"], f["first_step"]) for f in hook.findings] == [("grad_norm_spike", SPIKE_AT)]

        p.wait_for_function(
            """(n) => document.querySelector('[data-chart="param-grad-norm"]').data
                .some((t) => t.name === 'enc.weight' && t.x.includes(n))""",
            arg=SPIKE_AT,
        )
        for i, param in enumerate(PARAMS):
            drawn = plotted(p, param)
            assert sorted(drawn) == [*measured, *late]
            assert [drawn[n] for n in late] == pytest.approx(sent[:, i].tolist(), rel=1e-6)
        p.wait_for_function(
            """(n) => document.querySelector('[data-chart="param-grad-norm"]').dataset.markers === String(n)""",
            arg=SPIKE_AT,
        )
        expect(p.locator('.findings .finding[data-code="grad_norm_spike"] .finding-step')).to_have_text(
            f" · from step {SPIKE_AT}"
        )
