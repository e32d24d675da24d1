"""The diagnostics corpus: small real training scripts, each run as its own process with the
hook against a real `gradwatch serve`, and exactly the findings it should get.

Each script under corpus/ states what it should get: `EXPECTED_CODES` (the finding codes, and no
others), for a mistake `CAUSE_STEP` (the step where the mistake first shows; the finding must
begin there or within `WITHIN` steps after it; None: known from the start), and optionally
`EXPECTED_SEVERITY` (code -> severity, where a code's severity depends on the case). `clean_*`
scripts are correct training loops: they may get `info` findings (intended accumulation) but
never an error or a warning. `mistake_*` scripts make one classic mistake each. The training
instabilities (scripts declaring `UNSTABLE` or `STABLE_CONTROL`) run in test_instabilities.py, on
a server of their own, with both sampling settings; the codes they catch count here as covered.

A script whose mistake a sampled step shows (docs/diagnostics.md, "Which steps each check needs")
declares `EVERY_AUTO = True` and is run a second time with `every="auto"` (`CORPUS_EVERY`, read by
corpus/_sampling.py), as are clean scripts that look like those mistakes: it must get exactly the
same findings. Only those: each run is a fresh interpreter (torch's import is most of a script's
time), so the sampled runs add about a third to this module's time, not a whole run of the corpus.

Add a script to add a case: nothing here lists them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradwatch_server.diagnostics import CODES, RunContext, RunDiagnosis
from gradwatch_server.diagnostics.data import METRICS, SCALARS
from gradwatch_server.jobs.assemble import DESYNC_PREFIX
from gradwatch_server.store import open_store
from support.corpus import SCRIPTS, Outcome, declared, declares, is_instability_case, run_all
from support.server import start_server

CLASSIC = [s for s in SCRIPTS if not is_instability_case(s)]
#: (script, every) pairs: every script with every=1, those declaring EVERY_AUTO with "auto" too
RUNS = [(s.stem, "1") for s in CLASSIC] + [(s.stem, "auto") for s in CLASSIC if declares(s, "EVERY_AUTO")]
WITHIN = 5  # a finding begins at most this many steps after its cause
PARALLEL = 3
#: the module fixture runs every script (real training runs, a few at a time) before its first
#: test: minutes on a loaded 2-core machine, past pytest.ini's 300 s per test
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def corpus_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the corpus' server keeps its database (gradwatch.db) and the scripts their spool."""
    return tmp_path_factory.mktemp("corpus")


@pytest.fixture(scope="module")
def corpus(corpus_folder: Path) -> Iterator[dict[tuple[str, str], Outcome]]:
    """Every run of RUNS (a few at a time) against one server; their findings over REST."""
    folder = corpus_folder
    server = start_server(folder)
    by_stem = {s.stem: s for s in CLASSIC}
    try:
        outcomes = run_all([(by_stem[name], every) for name, every in RUNS], server, folder, PARALLEL)
        yield {(o.script.stem, o.every): o for o in outcomes}
    finally:
        server.stop()


@pytest.mark.parametrize(("name", "every"), RUNS)
def test_each_script_gets_exactly_its_findings(corpus: dict[tuple[str, str], Outcome], name: str, every: str) -> None:
    outcome = corpus[(name, every)]
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    assert outcome.findings, f"{name} printed no run id:\n{outcome.stdout}"
    try:
        severity: dict[str, str] = declared(outcome.script, "EXPECTED_SEVERITY")
    except LookupError:
        severity = {}
    for run_id, found in outcome.findings.items():
        assert outcome.codes(run_id) == outcome.expected, (run_id, found)
        assert {f["code"]: f["severity"] for f in found if f["code"] in severity} == severity
        try:
            cause = declared(outcome.script, "CAUSE_STEP")
        except LookupError:
            continue
        for f in found:
            if cause is None:
                assert f["first_step"] is None, f
            else:
                assert cause <= f["first_step"] <= cause + WITHIN, (f, cause)


@pytest.mark.parametrize(("name", "every"), RUNS)
def test_each_finding_is_one_warning_in_the_training_process(
    corpus: dict[tuple[str, str], Outcome], name: str, every: str
) -> None:
    """The hook shows each code once, as a GradwatchWarning on stderr (once more if it turned
    graver while the run went on), with the fix and the run's page."""
    outcome = corpus[(name, every)]
    shown = re.findall(
        r"GradwatchWarning: gradwatch (\w+): (.+) \[(\w+), (?:step \d+|from the start); "
        r"(http://\S+/runs/\w+)\]",
        outcome.stderr,
    )
    found = {f["code"]: f for run in outcome.findings.values() for f in run}
    assert {code for *_, code, _ in shown} == set(found)
    for _, message, code, page in shown:
        assert page.rsplit("/", 1)[1] in outcome.findings
        assert message.split(" ")[:2] == found[code]["message"].split(" ")[:2]  # the same sentence, maybe earlier
    for code, f in found.items():
        severities = [s for s, _, c, _ in shown if c == code]
        assert severities[-1] == f["severity"] and len(severities) == len(set(severities)), severities


@pytest.mark.parametrize("every", ["1", "auto"])
def test_precision_and_recall_are_100_percent(corpus: dict[tuple[str, str], Outcome], every: str) -> None:
    """Over the whole corpus, with each sampling setting: every expected finding is found,
    nothing else is; and no clean script gets an error or a warning."""
    runs = {name: o for (name, e), o in corpus.items() if e == every}
    expected = {(o.script.stem, run_id, code) for o in runs.values() for run_id in o.findings for code in o.expected}
    got = {
        (o.script.stem, run_id, f["code"]) for o in runs.values() for run_id, found in o.findings.items() for f in found
    }
    true = expected & got
    precision = len(true) / len(got) if got else 1.0
    recall = len(true) / len(expected) if expected else 1.0
    assert (precision, recall) == (1.0, 1.0), {"missed": expected - got, "spurious": got - expected}
    clean = [
        (name, f["code"], f["severity"])
        for name, o in runs.items()
        if name.startswith("clean_")
        for found in o.findings.values()
        for f in found
    ]
    assert all(severity == "info" for _, _, severity in clean), clean
    assert sum(1 for name in runs if name.startswith("clean_")) >= (8 if every == "1" else 3)
    assert sum(1 for name in runs if name.startswith("mistake_")) >= (10 if every == "1" else 6)


def test_the_live_findings_are_those_of_the_steps_judged_one_by_one(
    corpus: dict[tuple[str, str], Outcome], corpus_folder: Path
) -> None:
    """The server judged each batch of steps at once (`Check.observe_batch`); judged again here
    from the stored steps one by one (`RunDiagnosis.observe_record`, the oracle), every run of
    the corpus has exactly the findings it got live: codes, steps, messages and figures."""
    store = open_store(f"sqlite:///{corpus_folder / 'gradwatch.db'}")
    try:
        compared = 0
        for outcome in corpus.values():
            for run_id, found in outcome.findings.items():
                run = store.get_run(run_id)
                assert run is not None
                params = store.get_params(run_id)
                diag = RunDiagnosis(RunContext.of([(p.name, p.numel, p.dtype) for p in params], run.config))
                desync = [k for k in store.series_names(run_id, "scalar") if k.startswith(DESYNC_PREFIX)]
                for chunk in store.iter_steps(run_id, metrics=METRICS, scalar_keys=(*SCALARS, *desync)):
                    for record in chunk:
                        diag.observe_record(record.step, record.scalars, record.arrays)
                oracle = [f.to_dict() for f in diag.findings()]
                for f in oracle:  # the API's shape: a figure's evidence is there, null if none
                    if f["figure"] is not None:
                        f["figure"].setdefault("evidence", None)
                assert oracle == found, (outcome.script.stem, outcome.every)
                compared += 1
        assert compared >= len(corpus)
    finally:
        store.close()


def test_every_code_is_caught_by_some_script() -> None:
    """Every code, by a classic script here or an instability script (test_instabilities.py)."""
    covered = set().union(*(declared(s, "EXPECTED_CODES") for s in SCRIPTS))
    assert covered == set(CODES)


#: the codes a sampled step shows (docs/diagnostics.md, "Which steps each check needs"); the
#: instability codes are run with every="auto" in test_instabilities.py
SAMPLED_CODES = {
    "grad_accumulation_unbounded",
    "grad_accumulation",
    "zero_filled_grad_buffers",
    "step_without_grad",
    "nonfinite_grad",
    "param_not_in_optimizer",
    "amp_skipped_steps",
}


def test_every_code_a_sampled_step_shows_is_run_with_every_auto() -> None:
    sampled = [s for s in CLASSIC if declares(s, "EVERY_AUTO")]
    assert set().union(*(declared(s, "EXPECTED_CODES") for s in sampled)) == SAMPLED_CODES


def test_exploding_and_vanishing_stay_quiet_on_a_converging_run(corpus: dict[tuple[str, str], Outcome]) -> None:
    """corpus/clean_converging.py: 200 steps of a classifier that really converges (its loss
    more than halves, with the usual noise and bumps), and neither exploding_grad nor
    vanishing_grad is found."""
    outcome = corpus[("clean_converging", "1")]
    ((run_id, found),) = outcome.findings.items()
    assert not {"exploding_grad", "vanishing_grad"} & {f["code"] for f in found}
    loss = outcome.loss[run_id]
    assert len(loss) == 200
    assert sum(loss[-20:]) < 0.5 * sum(loss[:20]), loss
