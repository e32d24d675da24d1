"""examples/ddp.py and examples/fsdp.py as a user runs them (`torchrun --nproc-per-node 2`, CPU,
gloo) against a real server: each job is one run of world size 2 whose every per-parameter norm
equals what the example itself computed (`--oracle`: DDP from rank 0's synchronised tensors,
FSDP from the full tensors it gathers)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.distruns import ADAM_METRICS, assert_norms, exported, get, job_of, settled
from support.server import REPO, ServerProcess, server_env, start_server

pytestmark = pytest.mark.server

STEPS = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path_factory.mktemp("examples"))
    try:
        yield proc
    finally:
        proc.stop()


def torchrun(server: ServerProcess, folder: Path, script: str, *args: str) -> str:
    """Run examples/`script` on 2 ranks with $GRADWATCH_SERVER set; the run id rank 0 printed."""
    env = server_env({"GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL": str(folder / "spool"), "OMP_NUM_THREADS": "1"})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(REPO / "examples" / script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=folder,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    found = re.findall(r"^gradwatch run id: ([\w.-]+)$", done.stdout, re.M)
    assert len(found) == 1, done.stdout  # rank 0 prints it
    assert not list((folder / "spool").glob("*.spool"))  # both ranks delivered everything
    return job_of(found[0])


@pytest.mark.parametrize(
    "script, args", [("ddp.py", ()), ("fsdp.py", ()), ("fsdp.py", ("--fsdp1",))], ids=["ddp", "fsdp2", "fsdp1"]
)
def test_the_example_is_one_run_equal_to_its_oracle(
    server: ServerProcess, tmp_path: Path, script: str, args: tuple[str, ...]
) -> None:
    oracle_file = tmp_path / "oracle.jsonl"
    run_name = f"example-{script}{''.join(args)}"
    job = torchrun(
        server, tmp_path, script, "--steps", str(STEPS), "--name", run_name, "--oracle", str(oracle_file), *args
    )
    settled(server.url, job)
    listed = [r for r in get(server.url, "/api/runs", limit=100)["data"] if r["name"] == run_name]
    assert [(r["id"], r["world_size"], r["steps"]) for r in listed] == [(job, 2, STEPS)]
    ranks = get(server.url, f"/api/runs/{job}/ranks")
    assert [(r["rank"], r["status"], r["steps"]) for r in ranks["ranks"]] == [
        (0, "finished", STEPS),
        (1, "finished", STEPS),
    ]
    oracle = {}
    for line in oracle_file.read_text().splitlines():
        record = json.loads(line)
        oracle[record.pop("step")] = record
    assert set(oracle[1]) == set(ADAM_METRICS)
    params = len(oracle[1]["grad_norm"])
    assert assert_norms(exported(server.url, job), oracle, script) == STEPS * len(ADAM_METRICS) * params
