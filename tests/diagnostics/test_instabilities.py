"""Training instabilities: the corpus scripts that declare `UNSTABLE = True` (a bad
batch, a learning rate driven too high, a layer whose Adam second moment never built up) and the
stable controls (`STABLE_CONTROL = True`: a warm-up with cosine decay, accumulation with
clipping, a noisy small GPT), each run twice against one real server: with `every=1` and with
`every="auto"` (`CORPUS_EVERY`, read by corpus/_tiny.py).

Each unstable script must get a warning at or before the step where its loss first exceeds 3x the
median of its previous 50 losses, with both settings; the controls get no warning at all. With
every=1 each script gets exactly its `EXPECTED_CODES`, its findings beginning within `WITHIN`
steps after `CAUSE_STEP`; sampled, what it gets is among them. `-s` prints, per script and
setting, the loss spike's step, the first warning's step and code, and the lead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.corpus import SCRIPTS, Outcome, declared, declares, first_warning, is_instability_case, loss_onset, run_all
from support.server import start_server

CASES = [s for s in SCRIPTS if is_instability_case(s)]
SETTINGS = ("1", "auto")
PARALLEL = 3
#: the module fixture runs every script (real training runs, a few at a time) before its first
#: test: minutes on a loaded 2-core machine, past pytest.ini's 300 s per test
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], Outcome]]:
    folder = tmp_path_factory.mktemp("instabilities")
    server = start_server(folder)
    try:
        outcomes = run_all([(s, every) for every in SETTINGS for s in CASES], server, folder, PARALLEL)
        yield {(o.script.stem, o.every): o for o in outcomes}
    finally:
        server.stop()


def test_there_are_unstable_scripts_and_controls() -> None:
    assert sum(declares(s, "UNSTABLE") for s in CASES) >= 3
    assert sum(declares(s, "STABLE_CONTROL") for s in CASES) >= 3


@pytest.mark.parametrize("every", SETTINGS)
@pytest.mark.parametrize("name", [s.stem for s in CASES])
def test_instabilities_are_warned_at_or_before_the_loss_spikes(
    runs: dict[tuple[str, str], Outcome], name: str, every: str
) -> None:
    outcome = runs[(name, every)]
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    ((run_id, found),) = outcome.findings.items()
    codes = outcome.codes(run_id)
    if every == "1":
        assert codes == outcome.expected, found
        cause, within = declared(outcome.script, "CAUSE_STEP") if declares(outcome.script, "UNSTABLE") else None, 5
        try:
            within = declared(outcome.script, "WITHIN")
        except LookupError:
            pass
        for f in found:
            if cause is not None and f["severity"] != "info":
                assert cause <= f["first_step"] <= cause + within, (f, cause)
    else:  # sampled: what is found is among what every step finds
        assert codes <= outcome.expected, found
    loss, steps = outcome.loss[run_id], outcome.loss_steps[run_id]
    assert steps == list(range(steps[0], steps[0] + len(steps))), "the loss of every step is stored"
    onset = loss_onset(loss)
    warned = first_warning(found)
    if declares(outcome.script, "STABLE_CONTROL"):
        assert onset is None, (name, steps[onset] if onset is not None else None)
        assert warned is None, found
        return
    assert onset is not None, f"{name}: the loss never spiked: the script no longer shows the instability"
    spike = steps[onset]
    assert warned is not None, (name, every, spike, found)
    print(
        f"\n{name} every={every}: loss spike at step {spike}; first warning {warned['code']} at step "
        f"{warned['first_step']}, lead {spike - warned['first_step']} steps; all: "
        + ", ".join(f"{f['code']}@{f['first_step']}" for f in found)
    )
    assert warned["first_step"] <= spike, (spike, found)
