"""The diagnostics corpus: small real training scripts, each run as its own process with the
hook against a real `gradwatch serve`, and exactly the findings it should get.

Each script under corpus/ states what it should get: `EXPECTED_CODES` (the finding codes, and no
others), for a mistake `CAUSE_STEP` (the step where the mistake first shows; the finding must
begin there or within `WITHIN` steps after it; None: known from the start), and optionally
`EXPECTED_SEVERITY` (code -> severity, where a code's severity depends on the case). `clean_*`
scripts are correct training loops: they may get `info` findings (intended accumulation) but
never an error or a warning. `mistake_*` scripts make one classic mistake each.

Add a script to add a case: nothing here lists them.
"""

from __future__ import annotations

import ast
import concurrent.futures
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gradwatch_server.diagnostics import CODES
from support.server import ServerProcess, server_env, start_server

CORPUS = Path(__file__).parent / "corpus"
SCRIPTS = sorted(CORPUS.glob("*.py"))
WITHIN = 5  # a finding begins at most this many steps after its cause
PARALLEL = 3


def declared(path: Path, name: str) -> Any:
    """A module-level constant of a script (`EXPECTED_CODES`, `CAUSE_STEP`), read without running it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                if isinstance(node.value, ast.Call) and ast.unparse(node.value) == "set()":
                    return set()
                return ast.literal_eval(node.value)
    raise LookupError(name)


@dataclass
class Outcome:
    """One corpus script, run: its exit status, output, and the findings of each of its runs."""

    script: Path
    returncode: int
    stdout: str
    stderr: str
    findings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run id -> findings
    loss: dict[str, list[float]] = field(default_factory=dict)  # run id -> logged loss, if any

    @property
    def expected(self) -> set[str]:
        codes: set[str] = declared(self.script, "EXPECTED_CODES")
        return codes

    def codes(self, run_id: str) -> set[str]:
        return {f["code"] for f in self.findings[run_id]}


def run_script(script: Path, server: ServerProcess, folder: Path) -> Outcome:
    env = server_env(
        {"GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL": str(folder / "spool"), "PYTHONWARNINGS": "default"}
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env, cwd=folder
    )
    return Outcome(script, done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    """Every script run once (a few at a time) against one server; their findings over REST."""
    folder = tmp_path_factory.mktemp("corpus")
    server = start_server(folder)
    try:
        with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
            outcomes = list(pool.map(lambda s: run_script(s, server, folder), SCRIPTS))
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for outcome in outcomes:
                for run_id in re.findall(r"^gradwatch run: (\S+)$", outcome.stdout, re.M):
                    response = http.get(f"/api/runs/{run_id}/diagnostics")
                    assert response.status_code == 200, response.text
                    outcome.findings[run_id] = response.json()
                    loss = http.get(f"/api/runs/{run_id}/series", params={"key": "loss"})
                    if loss.status_code == 200:
                        outcome.loss[run_id] = loss.json()["value"]
        yield {o.script.stem: o for o in outcomes}
    finally:
        server.stop()


@pytest.mark.parametrize("name", [s.stem for s in SCRIPTS])
def test_each_script_gets_exactly_its_findings(corpus: dict[str, Outcome], name: str) -> None:
    outcome = corpus[name]
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


@pytest.mark.parametrize("name", [s.stem for s in SCRIPTS])
def test_each_finding_is_one_warning_in_the_training_process(corpus: dict[str, Outcome], name: str) -> None:
    """The hook shows each code once, as a GradwatchWarning on stderr (once more if it turned
    graver while the run went on), with the fix and the run's page."""
    outcome = corpus[name]
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


def test_precision_and_recall_are_100_percent(corpus: dict[str, Outcome]) -> None:
    """Over the whole corpus: every expected finding is found, nothing else is; and no clean
    script gets an error or a warning."""
    expected = {(o.script.stem, run_id, code) for o in corpus.values() for run_id in o.findings for code in o.expected}
    got = {
        (o.script.stem, run_id, f["code"])
        for o in corpus.values()
        for run_id, found in o.findings.items()
        for f in found
    }
    true = expected & got
    precision = len(true) / len(got) if got else 1.0
    recall = len(true) / len(expected) if expected else 1.0
    assert (precision, recall) == (1.0, 1.0), {"missed": expected - got, "spurious": got - expected}
    clean = [
        (name, f["code"], f["severity"])
        for name, o in corpus.items()
        if name.startswith("clean_")
        for found in o.findings.values()
        for f in found
    ]
    assert all(severity == "info" for _, _, severity in clean), clean
    assert sum(1 for name in corpus if name.startswith("clean_")) >= 8


def test_every_code_is_caught_by_some_script() -> None:
    covered = set().union(*(declared(s, "EXPECTED_CODES") for s in SCRIPTS))
    assert covered == set(CODES)


def test_exploding_and_vanishing_stay_quiet_on_a_converging_run(corpus: dict[str, Outcome]) -> None:
    """corpus/clean_converging.py: 200 steps of a classifier that really converges (its loss
    more than halves, with the usual noise and bumps), and neither exploding_grad nor
    vanishing_grad is found."""
    outcome = corpus["clean_converging"]
    ((run_id, found),) = outcome.findings.items()
    assert not {"exploding_grad", "vanishing_grad"} & {f["code"] for f in found}
    loss = outcome.loss[run_id]
    assert len(loss) == 200
    assert sum(loss[-20:]) < 0.5 * sum(loss[:20]), loss
