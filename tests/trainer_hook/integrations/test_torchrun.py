"""The framework callbacks under `torchrun --nproc-per-node 2` (CPU, gloo DDP): every rank watches
and the job is one run. Each script (torchrun/) is launched as a user would; no server is
reachable, so each rank's stream is read back from its spool file: one per rank, both of the
same job, each with its `dist` hello and every optimizer step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gradwatch.spool import pending_spools, read_records

pytestmark = pytest.mark.unit

STEPS = 3
SCRIPTS = Path(__file__).resolve().parent / "torchrun"


def torchrun(script: str, tmp_path: Path) -> list[list[dict[str, Any]]]:
    """Run torchrun/`script` on 2 ranks; each rank's spooled messages (its hello first), by rank."""
    spool = tmp_path / "spool"
    env = dict(os.environ, GRADWATCH_SPOOL=str(spool), OMP_NUM_THREADS="1")
    # --standalone: the rendezvous on a free port (torchrun's default 29500 may be another job's)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPTS / script)]
        + [str(tmp_path / "out"), str(STEPS)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    ids = [(tmp_path / "out" / f"ids.rank{rank}").read_text().split() for rank in (0, 1)]
    job = ids[0][0]
    assert ids == [[job, f"{job}.r0"], [job, f"{job}.r1"]], ids
    files = sorted(p.name for p in pending_spools(spool))
    assert files == [f"{job}.r0.spool", f"{job}.r1.spool"], files
    return [[json.loads(text) for text in read_records(spool / name)[0]] for name in files]


def check_one_run(streams: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Both streams are ranks of one job with the same run and parameters; returns the hellos."""
    hellos = [messages[0] for messages in streams]
    job = hellos[0]["dist"]["job"]
    for rank, (hello, messages) in enumerate(zip(hellos, streams)):
        assert hello["dist"] == {"job": job, "rank": rank, "world_size": 2}
        assert hello["run"]["id"] == f"{job}.r{rank}"
        assert hello["run"]["config"]["dist"]["backend"] == "gloo"
        assert hello["run"]["config"]["dist"]["local_rank"] == rank
        steps = [s for m in messages[1:] if m["type"] != "close" for s in _as_list(m["step"])]
        assert steps == list(range(1, STEPS + 1)), (rank, steps)
        for m in messages[1:]:
            if m["type"] != "close":
                assert all(v > 0 for v in _as_list(m["scalars"]["time/step_s"])), m["scalars"]
        assert messages[-1] == {**messages[-1], "type": "close", "status": "finished"}
    for key in ("name", "project", "optimizer"):
        assert hellos[0]["run"][key] == hellos[1]["run"][key], key
    shapes = [[(p["name"], p["shape"], p["numel"]) for p in hello["params"]] for hello in hellos]
    assert shapes[0] == shapes[1]
    for rank, hello in enumerate(hellos):  # DDP replicas: whole tensors, counted once (rank 0's)
        assert {(p["local_numel"] == p["numel"], p["counted"]) for p in hello["params"]} == {(True, rank == 0)}
    assert not any(p["name"].startswith("module.") for p in hellos[0]["params"])
    return hellos


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@pytest.mark.slow
def test_lightning_ddp_on_two_processes_is_one_run(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch", reason="needs Lightning (pip install gradwatch[lightning])")
    streams = torchrun("lightning_ddp.py", tmp_path)
    hellos = check_one_run(streams)
    assert hellos[0]["run"]["name"] == "tiny/version_0" and hellos[0]["run"]["project"] == "torchrun"
    assert [p["name"] for p in hellos[0]["params"]] == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    for messages in streams:  # each rank's own logged loss rides with its steps
        assert all("train_loss" in m["scalars"] for m in messages[1:] if m["type"] != "close")


@pytest.mark.slow
def test_hf_trainer_ddp_on_two_processes_is_one_run(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="needs transformers (pip install gradwatch[transformers])")
    hellos = check_one_run(torchrun("hf_ddp.py", tmp_path))
    assert hellos[0]["run"]["name"] == "hf-ddp"
    assert hellos[0]["run"]["config"]["user"]["framework"] == "transformers"
    assert hellos[0]["params"][0]["name"] == "transformer.wte.weight"
