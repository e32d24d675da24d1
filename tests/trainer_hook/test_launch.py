"""`gradwatch-run`: unmodified scripts (tests/trainer_hook/unmodified/, which never import
gradwatch; the examples, which call watch() themselves) run under it against a real server, their
stored norms equal to what each script computed itself; their exit status, output and arguments
are their own; bad usage gets a clear error."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from support.distruns import assert_close, assert_norms, exported, get, settled, wait_for
from support.server import REPO, ServerProcess, server_env, start_server

pytestmark = pytest.mark.server

HERE = Path(__file__).resolve().parent / "unmodified"
LAUNCHER = [sys.executable, "-m", "gradwatch.launch"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path_factory.mktemp("launch"))
    try:
        yield proc
    finally:
        proc.stop()


def launch(
    folder: Path, *argv: str, server: ServerProcess | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    extra = {"GRADWATCH_SPOOL": str(folder / "spool"), "OMP_NUM_THREADS": "1"}
    if server is not None:
        extra["GRADWATCH_SERVER"] = server.url
    return subprocess.run(
        [*LAUNCHER, *argv], capture_output=True, text=True, timeout=timeout, env=server_env(extra), cwd=folder
    )


#: the module's launches by key: `launched("gan")` is (its folder, its completed process)
Launched = Callable[[str], tuple[Path, subprocess.CompletedProcess[str]]]
PLAIN_ARGS = ["--steps", "3", "--oracle", "oracle.jsonl", "--exit", "3"]  # the oracle in its folder
TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node",
    "2",
    str(HERE / "ddp.py"),
]


def plain_alone(folder: Path) -> subprocess.CompletedProcess[str]:
    """plain.py alone, not launched (it writes the same oracle as the launched one)."""
    return subprocess.run(
        [sys.executable, str(HERE / "plain.py"), *PLAIN_ARGS],
        capture_output=True,
        text=True,
        timeout=120,
        env=server_env({"OMP_NUM_THREADS": "1"}),
        cwd=folder,
    )


def oracle_argv(folder: Path) -> list[str]:
    return ["--oracle", str(folder / "oracle.jsonl")]


#: what each training test launches (its folder: the oracle, the spool, the working directory)
LAUNCHES: dict[str, Callable[[Path, ServerProcess], subprocess.CompletedProcess[str]]] = {
    "plain-alone": lambda folder, server: plain_alone(folder),
    "plain": lambda folder, server: launch(
        folder, "--project", "launch", "--run", "plain", "--", sys.executable, str(HERE / "plain.py"),
        *PLAIN_ARGS, server=server,
    ),
    "gan": lambda folder, server: launch(
        folder, "--run", "gan", "--", sys.executable, str(HERE / "plain.py"), "--gan", *oracle_argv(folder),
        server=server,
    ),
    "compiled": lambda folder, server: launch(
        folder, "--run", "compiled", "--every", "2", "--", sys.executable, str(HERE / "plain.py"), "--compile",
        *oracle_argv(folder), server=server,
    ),
    "watches-itself": lambda folder, server: launch(
        folder, "--run", "launcher-name", "--", sys.executable, str(REPO / "examples" / "train_transformer.py"),
        "--steps", "3", "--run", "own-name", server=server,
    ),
    "ddp": lambda folder, server: launch(folder, "--run", "ddp-launch", "--", *TORCHRUN, *oracle_argv(folder), server=server),
    "hf": lambda folder, server: launch(
        folder, "--run", "hf-launch", "--", sys.executable, str(HERE / "hf_trainer.py"), *oracle_argv(folder),
        server=server,
    ),
    "zero": lambda folder, server: launch(
        folder, "--run", "zero", "--", *TORCHRUN, "--zero", *oracle_argv(folder), server=server
    ),
}  # fmt: skip
#: launches at a time: each is fresh interpreters importing torch (the ranks and torchrun's agent
#: too), so the module's wall is theirs; two at once overlap one's imports with the other's waits
PARALLEL = 2


@pytest.fixture(scope="module")
def launched(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    """Every launch of LAUNCHES started at the module's first test, PARALLEL at a time, in the
    tests' order; `launched(key)` waits for that one: (its folder, its completed process). Each
    test asserts on its own launch; the runs are told apart by name."""
    keys = [k for k in LAUNCHES if k != "hf" or importlib.util.find_spec("transformers") is not None]
    with ThreadPoolExecutor(PARALLEL) as pool:
        started: dict[str, tuple[Path, Future[subprocess.CompletedProcess[str]]]] = {}
        for key in keys:
            folder = tmp_path_factory.mktemp(key)
            started[key] = (folder, pool.submit(LAUNCHES[key], folder, server))

        def result(key: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
            folder, future = started[key]
            return folder, future.result()

        yield result


def oracle_of(path: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out[record.pop("step")] = record
    return out


def runs_named(server: ServerProcess, name: str, count: int = 1) -> list[dict[str, Any]]:
    """The runs called `name`, once `count` of them are finished."""

    def check() -> list[dict[str, Any]] | None:
        found = [r for r in get(server.url, "/api/runs", limit=500)["data"] if r["name"] == name]
        return found if len(found) == count and all(r["status"] == "finished" for r in found) else None

    return wait_for(f"{count} finished runs named {name}", check)  # type: ignore[no-any-return]


def test_a_plain_script_is_one_run_equal_to_its_oracle_and_keeps_its_output_and_status(
    server: ServerProcess, launched: Launched
) -> None:
    folder, done = launched("plain")
    alone_folder, alone = launched("plain-alone")  # the same script alone
    assert done.returncode == 3 == alone.returncode, done.stderr[-3000:]
    assert done.stdout == alone.stdout  # the script's output, untouched
    assert done.stderr == alone.stderr
    assert f"argv {json.dumps(PLAIN_ARGS)}" in done.stdout.splitlines()
    assert oracle_of(alone_folder / "oracle.jsonl") == oracle_of(folder / "oracle.jsonl")
    [run] = runs_named(server, "plain")
    assert run["project"] == "launch" and run["steps"] == 3
    oracle = oracle_of(folder / "oracle.jsonl")
    assert set(oracle[1]) == {"grad_norm", "param_norm", "exp_avg_norm", "exp_avg_sq_norm"}
    assert assert_norms(exported(server.url, run["id"]), oracle, "plain") == 3 * 4 * 4
    assert not list((folder / "spool").glob("*.spool"))


def test_two_optimizers_of_two_models_are_one_run_named_after_their_models(
    server: ServerProcess, launched: Launched
) -> None:
    folder, done = launched("gan")
    oracle_file = folder / "oracle.jsonl"
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = runs_named(server, "gan")
    assert run["steps"] == 4
    oracle = oracle_of(oracle_file)
    assert sorted(oracle[1]["grad_norm"])[0].startswith("Sequential.")
    assert "Sequential2.0.weight" in oracle[1]["momentum_buffer_norm"]
    stored = exported(server.url, run["id"])
    assert sorted(stored) == sorted(oracle)
    checked = 0
    for step, metrics in oracle.items():  # each optimizer's state is its own parameters'
        for metric, values in metrics.items():
            for name, value in values.items():
                assert_close(stored[step][metric][name], value, f"gan step {step} {metric} {name}")
                checked += 1
    assert checked == 4 * (8 * 2 + 4 * 2 + 4)  # grad and param of 8; Adam's 2 of 4; SGD's momentum of 4


def test_torch_compile_names_are_the_models(server: ServerProcess, launched: Launched) -> None:
    folder, done = launched("compiled")
    oracle_file = folder / "oracle.jsonl"
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = runs_named(server, "compiled")
    stored = exported(server.url, run["id"])
    measured = [s for s, row in stored.items() if "grad_norm" in row]
    assert len(stored) == 4 and len(measured) == 2  # --every 2
    oracle = {s: v for s, v in oracle_of(oracle_file).items() if s in measured}
    assert sorted(oracle[measured[0]]["param_norm"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert assert_norms({s: stored[s] for s in measured}, oracle, "compiled") == 2 * 4 * 4


def test_a_script_that_watches_itself_is_watched_once(server: ServerProcess, launched: Launched) -> None:
    _, done = launched("watches-itself")
    assert done.returncode == 0, done.stderr[-3000:]
    runs_named(server, "own-name")
    assert not [r for r in get(server.url, "/api/runs", limit=500)["data"] if r["name"].startswith("launcher-name")]


def test_torchrun_ddp_is_one_job_equal_to_rank_0s_oracle(server: ServerProcess, launched: Launched) -> None:
    folder, done = launched("ddp")
    oracle_file = folder / "oracle.jsonl"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.splitlines().count("trained") == 1
    [run] = runs_named(server, "ddp-launch")
    settled(server.url, run["id"])
    assert run["world_size"] == 2 and run["steps"] == 4
    oracle = oracle_of(oracle_file)
    assert assert_norms(exported(server.url, run["id"]), oracle, "ddp") == 4 * 4 * 6


def test_a_hf_trainer_script_is_one_run_equal_to_its_own_callback(server: ServerProcess, launched: Launched) -> None:
    pytest.importorskip("transformers", reason="needs transformers (pip install gradwatch[transformers])")
    folder, done = launched("hf")
    oracle_file = folder / "oracle.jsonl"
    assert done.returncode == 0, done.stderr[-3000:]
    [run] = runs_named(server, "hf-launch")
    oracle = oracle_of(oracle_file)
    assert "transformer.wte.weight" in oracle[1]["grad_norm"]
    assert assert_norms(exported(server.url, run["id"]), oracle, "hf") == 3 * 4 * len(oracle[1]["grad_norm"])


def test_help_and_bad_usage(tmp_path: Path) -> None:
    shown = launch(tmp_path, "--help")
    assert shown.returncode == 0 and "gradwatch-run [--project P]" in shown.stdout and "exit status" in shown.stdout
    for argv, says in [
        ((), "no command: put it after --"),
        (("--", "no-such-command-here"), "command not found: no-such-command-here"),
        (("--every", "0", "--", "true"), "--every must be a whole number"),
        (("--every", "often", "--", "true"), "--every must be a whole number"),
        (("--server", "ftp://x", "--", "true"), "--server: server must be an http(s)://"),
        (("--run", "a\nb", "--", "true"), "--run must be 1 to 200 printable characters"),
        (("--bogus", "--", "true"), "unrecognized arguments: --bogus"),
    ]:
        done = launch(tmp_path, *argv)
        assert done.returncode == (127 if "not found" in says else 2), (argv, done.stderr)
        assert says in done.stderr, (argv, done.stderr)
        assert done.stdout == ""


def test_the_hidden_sitecustomize_still_runs_and_sys_path_is_the_scripts(tmp_path: Path) -> None:
    """The launcher's sitecustomize comes first on PYTHONPATH: the one it hides runs after it,
    and the script sees no folder of the launcher's on sys.path."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    code = (
        "import os, sys, json; print(json.dumps([os.environ.get('THEIRS_RAN'), "
        "[p for p in sys.path if p.endswith('_site')], 'torch' in sys.modules]))"
    )
    env = server_env({"PYTHONPATH": str(theirs)})
    done = subprocess.run(
        [*LAUNCHER, "--", sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["1", [], False]  # no torch imported for a script that imports none


def test_zero_redundancy_state_is_each_parameters_owners(server: ServerProcess, launched: Launched) -> None:
    """ZeroRedundancyOptimizer under DDP: each parameter's Adam state lives on the one rank that
    owns it; the job's `<key>_norm` equals that rank's state at every step (each rank's oracle
    reads its own `.optim.state`), and the parameters and gradients equal rank 0's."""
    folder, done = launched("zero")
    oracle_file = folder / "oracle.jsonl"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    [run] = runs_named(server, "zero")
    settled(server.url, run["id"])
    ranks = [oracle_of(oracle_file.with_suffix(f".{r}")) for r in (0, 1)]
    oracle: dict[int, dict[str, Any]] = {}
    for step, record in ranks[0].items():
        oracle[step] = {"grad_norm": record["grad_norm"], "param_norm": record["param_norm"]}
        for key in ("exp_avg_norm", "exp_avg_sq_norm"):
            owned = [rank[step].get(key, {}) for rank in ranks]
            assert owned[0] and owned[1] and not set(owned[0]) & set(owned[1])  # each rank owns some, none twice
            oracle[step][key] = {**owned[0], **owned[1]}
    assert assert_norms(exported(server.url, run["id"]), oracle, "zero") == 4 * 4 * 6
