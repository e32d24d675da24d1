"""gradwatch.integrations.transformers: a real `transformers.Trainer` on a tiny GPT-2 (built from
a config, nothing downloaded) streaming to a real server, against an independent oracle."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install gradwatch[transformers])")
accelerate = pytest.importorskip("accelerate", reason="the Trainer needs accelerate")

from hf_training import STEPS, FailAtStep, tiny_gpt2, token_dataset, trainer_args  # noqa: E402
from stored import (  # noqa: E402
    Norms,
    accumulation,
    assert_equal_norms,
    assert_no_problem,
    grad_norms,
    listed_status,
    run_info,
    scalar_series,
    stored_norms,
)
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from gradwatch.integrations.transformers import GradwatchCallback  # noqa: E402
from support.corpus import Prefork  # noqa: E402
from support.examples import findings  # noqa: E402

pytestmark = pytest.mark.unit  # a test that starts a server says so (@pytest.mark.server)

ACCUMULATE = 4


class Oracle(TrainerCallback):  # type: ignore[misc]
    """Independent of gradwatch: the gradients at `on_pre_optimizer_step` (after the Trainer
    clipped them, just before the step uses them), and the optimizer steps the Trainer counts."""

    def __init__(self) -> None:
        self.norms: Norms = {}
        self.steps = 0

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.norms.update(grad_norms(dict(model.named_parameters()), state.global_step + 1))

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps += 1


def train(tmp_path: Path, server_url: str, **callback_args: Any) -> tuple[GradwatchCallback, Oracle, Trainer]:
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        run_name="tiny-gpt2",
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=ACCUMULATE,
        max_grad_norm=1.0,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    oracle, watching = Oracle(), GradwatchCallback(project="hf", server=server_url, warn=False, **callback_args)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=token_dataset(), callbacks=[oracle, watching])
    trainer.train()
    return watching, oracle, trainer


@pytest.mark.server
def test_trainer_values_equal_the_oracle_at_every_step(tmp_path: Path, sqlite_server) -> None:
    watching, oracle, trainer = train(tmp_path, sqlite_server.url)
    w = watching.watcher
    assert w is not None and w.pending == 0, "closed at train end with everything delivered"
    run = run_info(sqlite_server.url, w.run_id)
    assert (run["name"], run["project"], run["status"]) == ("tiny-gpt2", "hf", "finished")
    assert oracle.steps == STEPS and run["steps"] == STEPS  # one stored step per optimizer step
    stored = stored_norms(sqlite_server.url, w.run_id)
    assert {name for _, name in stored} == {name for name, _ in trainer.model.named_parameters()}
    assert_equal_norms(stored, oracle.norms)
    # clipping happened: the oracle's total norm is the clip threshold (the random model's is far above)
    total = sum(v * v for (s, _), v in oracle.norms.items() if s == 1) ** 0.5
    assert total == pytest.approx(1.0, rel=1e-4)
    found = findings(sqlite_server, w.run_id)
    assert_no_problem(found)
    assert accumulation(found) == ACCUMULATE


@pytest.mark.server
def test_trainer_config_and_logged_numbers_are_recorded(tmp_path: Path, sqlite_server) -> None:
    watching, _, trainer = train(tmp_path, sqlite_server.url, run="mine")
    w = watching.watcher
    assert w is not None
    run = run_info(sqlite_server.url, w.run_id)
    assert run["name"] == "mine"  # the user's name wins over args.run_name
    user = run["config"]["user"]
    assert user["gradient_accumulation_steps"] == ACCUMULATE
    assert user["training_args"]["max_grad_norm"] == 1.0 and user["training_args"]["run_name"] == "tiny-gpt2"
    assert user["model_config"]["n_embd"] == 32 and user["model_config"]["n_layer"] == 2
    # The Trainer logs after optimizer step N: its numbers are stored with step N+1, and those of
    # the last step have no step after them.
    logged = {h["step"]: h for h in trainer.state.log_history if "loss" in h}
    assert sorted(logged) == list(range(1, STEPS + 1))
    for key in ("loss", "learning_rate", "grad_norm"):
        series = scalar_series(sqlite_server.url, w.run_id, key)
        assert series["step"] == list(range(2, STEPS + 1))
        assert series["value"] == pytest.approx([logged[s - 1][key] for s in series["step"]], rel=1e-6)


@pytest.mark.server
def test_scaler_is_found_on_accelerates_optimizer(tmp_path: Path, sqlite_server) -> None:
    """fp16 training: accelerate's optimizer wrapper holds the Trainer's GradScaler and steps with
    it; the callback finds it there. (fp16 needs a GPU in the Trainer; this is the same wrapper
    made by hand on the CPU, stepped as accelerate steps it.)"""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    _ = args.device  # TrainingArguments sets up (and resets) accelerate's process state: before ours
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    accelerator = Accelerator(cpu=True)  # the process state accelerate's optimizer reads when it steps
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    wrapped = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), device_placement=False, scaler=scaler)
    callback = GradwatchCallback(server=sqlite_server.url, warn=False)
    callback.on_train_begin(args, None, None, model=model, optimizer=wrapped)
    w = callback.watcher
    assert w is not None
    oracle: Norms = {}
    for step in range(1, 4):
        wrapped.zero_grad()
        scaler.scale(model(torch.randn(8, 4)).pow(2).mean()).backward()
        true = {n: p.grad / scaler.get_scale() for n, p in model.named_parameters()}
        oracle.update({(step, n): float(torch.linalg.vector_norm(g)) for n, g in true.items()})
        wrapped.step()  # scaler.step(inner optimizer) then scaler.update()
    callback.on_train_end(args, None, None)
    assert w.pending == 0 and accelerator.state.distributed_type is not None
    config = run_info(sqlite_server.url, w.run_id)["config"]
    assert config["amp"] is True and config["wrappers"] == [["accelerate.optimizer.AcceleratedOptimizer"]]
    assert_equal_norms(stored_norms(sqlite_server.url, w.run_id), oracle)  # unscaled


@pytest.mark.server
def test_a_train_that_raised_is_closed_as_crashed_by_the_next_train(tmp_path: Path, sqlite_server) -> None:
    """The Trainer tells callbacks nothing when `train()` raises: the callback's next train begin
    closes the unfinished run as crashed, and the new run ends as finished."""
    watching = GradwatchCallback(server=sqlite_server.url, warn=False)
    failing = Trainer(
        model=tiny_gpt2(),
        args=trainer_args(tmp_path),
        train_dataset=token_dataset(),
        callbacks=[FailAtStep(3), watching],
    )
    with pytest.raises(RuntimeError, match="the user's bug"):
        failing.train()
    crashed = watching.watcher
    assert crashed is not None
    assert listed_status(sqlite_server.url, crashed.run_id, wait_s=10) == "running", "nothing closed it yet"
    Trainer(model=tiny_gpt2(), args=trainer_args(tmp_path), train_dataset=token_dataset(), callbacks=[watching]).train()
    finished = watching.watcher
    assert finished is not None and finished is not crashed and crashed.pending == finished.pending == 0
    assert listed_status(sqlite_server.url, crashed.run_id) == "crashed"
    assert run_info(sqlite_server.url, crashed.run_id)["steps"] == 2
    assert listed_status(sqlite_server.url, finished.run_id) == "finished"


TRAIN_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from hf_training import FailAtStep, token_dataset, tiny_gpt2, trainer_args
from transformers import Trainer
from gradwatch.integrations.transformers import GradwatchCallback

watching = GradwatchCallback(server={server!r}, warn=False)
callbacks = [FailAtStep(3)] if sys.argv[1] == "raise" else []
trainer = Trainer(model=tiny_gpt2(), args=trainer_args(Path({out!r})), train_dataset=token_dataset(),
                  callbacks=[*callbacks, watching])
try:
    trainer.train()
finally:
    print("RUN", watching.watcher.run_id, flush=True)
"""


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prefork]:
    """Each script its own process, forked from one that imported torch, transformers' Trainer
    and the callback once (tests/support/prefork.py): those imports are most of a script's time."""
    imports = ("transformers.trainer", "transformers.models.gpt2.modeling_gpt2", "gradwatch.integrations.transformers")
    forks = Prefork(tmp_path_factory.mktemp("hf-scripts"), imports)
    yield forks
    forks.close()


@pytest.mark.server
@pytest.mark.parametrize("how, status, steps", [("raise", "crashed", 2), ("end", "finished", STEPS)])
def test_a_script_whose_train_raised_ends_its_run_as_crashed(
    tmp_path: Path, sqlite_server, scripts: Prefork, how: str, status: str, steps: int
) -> None:
    """A script whose `train()` raises exits with the traceback: the exit hook closes the run as
    crashed (before the watcher's own exit hook, which would close it as finished). A script whose
    training ended closes it as finished."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            TRAIN_SCRIPT.format(tests=str(Path(__file__).parent), server=sqlite_server.url, out=str(tmp_path))
        )
    )
    done = scripts.run(script, dict(os.environ), 300, args=[how])
    assert (done.returncode != 0) == (how == "raise"), done.stderr[-3000:]
    if how == "raise":
        assert "RuntimeError: the user's bug" in done.stderr
    run_id = done.stdout.split("RUN ")[1].split()[0]
    assert listed_status(sqlite_server.url, run_id) == status
    assert run_info(sqlite_server.url, run_id)["steps"] == steps


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"every": 0}, ValueError),
        ({"every": "sometimes"}, ValueError),
        ({"run": ""}, ValueError),
        ({"project": 3}, TypeError),
        ({"server": "ftp://x"}, ValueError),
        ({"token": 5}, TypeError),
        ({"warn": "yes"}, TypeError),
        ({"on_finding": "print"}, TypeError),  # every option of watch() but model, scaler, config
        ({"projekt": "p"}, TypeError),  # a misspelt option
    ],
)
def test_bad_arguments_fail_when_the_callback_is_made(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        GradwatchCallback(**kwargs)


def test_train_begin_without_an_optimizer_says_so(tmp_path: Path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    with pytest.raises(TypeError, match="got no optimizer at train begin"):
        GradwatchCallback(server="http://127.0.0.1:9").on_train_begin(args, None, None, model=tiny_gpt2())


def test_every_process_watches(tmp_path: Path) -> None:
    """Under torchrun every process runs the callbacks, and every one watches: the ranks of the
    job make one run (test_torchrun.py runs a real 2-process job)."""
    from transformers import TrainerControl, TrainerState

    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True)
    model = tiny_gpt2()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    callback = GradwatchCallback(server="http://127.0.0.1:9")
    callback.on_train_begin(
        args, TrainerState(is_world_process_zero=False), TrainerControl(), model=model, optimizer=optimizer
    )
    assert callback.watcher is not None and optimizer._optimizer_step_pre_hooks
    callback.watcher.close(timeout=0.1)  # no server here: what train end does, without its 5 s wait
