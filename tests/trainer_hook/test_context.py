"""The run's context in the hello (gradwatch/context.py): each field against an independent
oracle, git read from a real checkout (and never failing watch()), and `config=` checked."""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import gradwatch
from gradwatch.context import git_state

pytestmark = pytest.mark.unit

NOWHERE = "http://127.0.0.1:9"  # nothing listens: the hello stays queued, readable in the sender


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(6, 5)
        self.norm = torch.nn.LayerNorm(5)
        self.head = torch.nn.Linear(5, 3)
        self.frozen = torch.nn.Linear(3, 3)
        self.frozen.requires_grad_(False)


def hello_config(w: gradwatch.Watcher) -> dict[str, Any]:
    config: dict[str, Any] = w._sender.hello["run"]["config"]
    json.dumps(config, allow_nan=False)  # what travels: strict JSON
    return config


def test_context_fields_match_independent_oracles() -> None:
    model = Net()
    decay = [model.body.weight, model.head.weight]
    no_decay = [model.body.bias, model.norm.weight, model.norm.bias, model.head.bias]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": 0.1, "name": "decay"},
            {"params": no_decay, "weight_decay": 0.0, "name": "no_decay", "lr": 1e-4},
        ],
        lr=3e-4,
        betas=(0.9, 0.95),
    )
    w = gradwatch.watch(opt, model=model, server=NOWHERE, warn=False)
    try:
        ctx = hello_config(w)["context"]
    finally:
        w.close(timeout=0.1)

    [entry] = ctx["optimizers"]
    assert entry["class"] == f"{torch.optim.AdamW.__module__}.AdamW"
    assert [g["name"] for g in entry["groups"]] == ["decay", "no_decay"]
    for group, given, lr, wd in zip(entry["groups"], (decay, no_decay), (3e-4, 1e-4), (0.1, 0.0)):
        assert group["hparams"]["lr"] == lr and group["hparams"]["weight_decay"] == wd
        assert group["hparams"]["betas"] == [0.9, 0.95]
        assert group["params"] == len(given)
        assert group["numel"] == sum(p.numel() for p in given)
    watched = decay + no_decay
    model_numel = 6 * 5 + 5 + 5 + 5 + 5 * 3 + 3 + 3 * 3 + 3
    assert ctx["parameters"] == {
        "tensors": len(watched),
        "numel": sum(p.numel() for p in watched),
        "model_numel": model_numel,
        "model_trainable_numel": model_numel - 12,
    }
    assert ctx["model"] == f"{__name__}.Net"
    assert ctx["versions"]["torch"] == torch.__version__
    assert ctx["versions"]["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert ctx["versions"]["gradwatch"] == gradwatch.__version__
    assert ctx["host"] == socket.gethostname()
    assert ctx["platform"] == platform.platform()
    assert ctx["devices"] == ["cpu"]
    assert ctx["argv"] == sys.argv
    assert ctx["cwd"] == os.getcwd()
    assert "user" not in hello_config(w)  # no config= given


def test_user_config_is_recorded_as_given() -> None:
    model = torch.nn.Linear(2, 2)
    given = {"lr": 3e-4, "batch_size": 64, "data": {"name": "tiny", "shards": [1, 2]}, "note": None, "aug": True}
    w = gradwatch.watch(torch.optim.SGD(model.parameters(), lr=0.1), model=model, server=NOWHERE, config=given)
    given["lr"] = 1.0  # a later change by the script is not what the run started with
    try:
        assert hello_config(w)["user"] == {
            "lr": 3e-4,
            "batch_size": 64,
            "data": {"name": "tiny", "shards": [1, 2]},
            "note": None,
            "aug": True,
        }
    finally:
        w.close(timeout=0.1)


@pytest.mark.parametrize(
    "config, error, match",
    [
        ([("lr", 1)], TypeError, "config must be a mapping of names to JSON values"),
        ("lr=1", TypeError, "config must be a mapping"),
        ({"lr": math.nan}, TypeError, "config must hold only JSON values"),
        ({"lr": math.inf}, TypeError, "no NaN or infinity"),
        ({"model": torch.nn.Linear(2, 2)}, TypeError, "config must hold only JSON values"),
        ({"ids": {1, 2}}, TypeError, "config must hold only JSON values"),
        ({"blob": "x" * (1 << 20)}, ValueError, "at most 1048576"),
    ],
)
def test_bad_config_is_refused_at_watch(config: Any, error: type[Exception], match: str) -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(error, match=match):
        gradwatch.watch(torch.optim.SGD(model.parameters(), lr=0.1), model=model, server=NOWHERE, config=config)


def test_bad_on_finding_is_refused_at_watch() -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="on_finding must be a function"):
        gradwatch.watch(torch.optim.SGD(model.parameters(), lr=0.1), server=NOWHERE, on_finding="print")


# -- git ------------------------------------------------------------------------------------------


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("print('hi')\n")
    git(repo, "add", "train.py")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def head_commit(repo: Path) -> str:
    """The oracle: the commit the branch file names, read without git."""
    return (repo / ".git" / "refs" / "heads" / "main").read_text().strip()


def test_git_commit_and_dirty_state(checkout: Path, tmp_path: Path) -> None:
    assert git_state(checkout) == {"commit": head_commit(checkout), "dirty": False}
    (checkout / "notes.txt").write_text("untracked files leave the tree clean\n")
    assert git_state(checkout) == {"commit": head_commit(checkout), "dirty": False}
    (checkout / "train.py").write_text("print('changed')\n")
    assert git_state(checkout) == {"commit": head_commit(checkout), "dirty": True}
    sub = checkout / "src"
    sub.mkdir()
    assert git_state(sub)["commit"] == head_commit(checkout)  # type: ignore[index]
    outside = tmp_path / "plain"
    outside.mkdir()
    assert git_state(outside) is None


def test_a_script_in_a_checkout_records_its_commit(checkout: Path) -> None:
    """The script's own folder decides, not the working directory: run it from elsewhere."""
    (checkout / "train.py").write_text(
        "import json, sys, torch, gradwatch\n"
        "m = torch.nn.Linear(2, 2)\n"
        "w = gradwatch.watch(torch.optim.SGD(m.parameters(), lr=0.1), model=m, server='http://127.0.0.1:9')\n"
        "print(json.dumps(w._sender.hello['run']['config']['context']))\n"
        "w.close(timeout=0.1)\n"
    )
    done = subprocess.run(
        [sys.executable, str(checkout / "train.py"), "--lr", "3e-4"],
        cwd=checkout.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ctx = json.loads(done.stdout.strip().splitlines()[-1])
    assert ctx["git"] == {"commit": head_commit(checkout), "dirty": True}  # train.py was rewritten
    assert ctx["argv"] == [str(checkout / "train.py"), "--lr", "3e-4"]


def test_a_hanging_or_missing_git_never_fails_watch(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    slow = bin_dir / "git"
    slow.write_text("#!/bin/sh\nexec /bin/sleep 30\n")
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bin_dir))  # only the hanging git
    started = time.monotonic()
    assert git_state(checkout, timeout=0.3) is None
    assert time.monotonic() - started < 5
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no git at all
    assert git_state(checkout) is None
    model = torch.nn.Linear(2, 2)
    w = gradwatch.watch(torch.optim.SGD(model.parameters(), lr=0.1), model=model, server=NOWHERE)
    try:
        ctx = hello_config(w)["context"]
        assert ctx["git"] is None and ctx["host"] == socket.gethostname()
    finally:
        w.close(timeout=0.1)


def test_credential_flags_are_redacted_from_the_command_line(tmp_path: Path) -> None:
    """The run context is readable without a token: values of --*token*/--*key*/--*secret*/
    --*password*/--*passwd*/--*credential* flags never reach it, in either form; the rest stays."""
    (tmp_path / "train.py").write_text(
        "import json, sys, torch, gradwatch\n"
        "m = torch.nn.Linear(2, 2)\n"
        "w = gradwatch.watch(torch.optim.SGD(m.parameters(), lr=0.1), model=m, server='http://127.0.0.1:9')\n"
        "print(json.dumps(w._sender.hello['run']['config']['context']))\n"
        "w.close(timeout=0.1)\n"
    )
    args = [
        "--hub_token",
        "hf_abcdef",
        "--lr",
        "3e-4",
        "--api-key=sk-123",
        "--DB_PASSWORD",
        "hunter2",
        "--passwd=pw",
        "--aws-secret-access-key",
        "AKIA",
        "--credentials-file=/c.json",
        "--use-token",
        "--epochs",
        "3",
        "-k",
        "visible",
        "--monkey-key",
    ]
    done = subprocess.run(
        [sys.executable, str(tmp_path / "train.py"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ctx = json.loads(done.stdout.strip().splitlines()[-1])
    assert ctx["argv"] == [
        str(tmp_path / "train.py"),
        "--hub_token",
        "***",
        "--lr",
        "3e-4",
        "--api-key=***",
        "--DB_PASSWORD",
        "***",
        "--passwd=***",
        "--aws-secret-access-key",
        "***",
        "--credentials-file=***",
        "--use-token",
        "--epochs",
        "3",
        "-k",
        "visible",
        "--monkey-key",
    ]
    for secret in ("hf_abcdef", "sk-123", "hunter2", "AKIA", "/c.json"):
        assert secret not in done.stdout
