"""`gradwatch import`: load a JSON-lines export back into a database.

The file is replayed through the wire protocol's models (a `hello` from the run line, a `step`
per step line), so an import is checked exactly like live ingest, and importing the same file
twice stores nothing the second time. A distributed job's export holds its global steps and then
its ranks' own (step lines with a `rank`): the job's run is imported with its global steps, and
the ranks' lines are counted and left out (their streams are not rebuilt).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .jsonvalues import metric_array
from .models import RunUpdate
from .protocol import PROTOCOL_VERSION, Hello, ProtocolError, Step, validate_message
from .store import StepData, Store


class ImportFailed(ValueError):
    """The file is not a gradwatch JSON-lines export; the message names the line."""


@dataclass(frozen=True)
class Imported:
    run_id: str
    stored: int
    skipped: int
    #: Step lines of a job's ranks (with a `rank`), left out.
    rank_lines: int = 0


def _b64(array: np.ndarray) -> str:
    return base64.b64encode(array.tobytes()).decode("ascii")


def _hello(line: dict[str, Any]) -> Hello:
    run = line["run"]
    message = validate_message(
        {
            "v": PROTOCOL_VERSION,
            "type": "hello",
            "run": {
                "id": run["id"],
                "name": run["name"],
                "project": run["project"],
                "started_at": run["created_at"],
                "hook_version": run.get("hook_version"),
                "optimizer": run.get("optimizer"),
                "config": run.get("config") or {},
            },
            "params": [
                {k: p[k] for k in ("name", "shape", "numel", "dtype", "group", "optimizer")} for p in line["params"]
            ],
            "groups": line.get("groups") or [],
        }
    )
    assert isinstance(message, Hello)
    return message


def _step(line: dict[str, Any], seq: int, param_count: int) -> Step:
    status = line.get("grad_status")
    message = validate_message(
        {
            "v": PROTOCOL_VERSION,
            "type": "step",
            "seq": line.get("seq", seq),
            "step": line["step"],
            "time": line["time"],
            "scalars": line.get("scalars") or {},
            "params": {m: _b64(metric_array(values)) for m, values in (line.get("params") or {}).items()},
            **({"grad_status": _b64(np.array(status, dtype="u1"))} if status is not None else {}),
        },
        param_count,
    )
    assert isinstance(message, Step)
    return message


def import_jsonl(store: Store, lines: Iterable[str], batch_size: int = 256) -> Imported:
    """Store the run of an export (lines of `gradwatch export --format json`), in batches."""
    hello: Hello | None = None
    final: dict[str, Any] = {}
    batch: list[StepData] = []
    stored = skipped = rank_lines = 0
    tags: list[str] | None = None

    def flush() -> None:
        nonlocal stored, skipped
        assert hello is not None
        written = store.write_steps(hello.run.id, batch)
        stored += sum(written)
        skipped += len(written) - sum(written)
        batch.clear()

    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            if hello is None:
                if not isinstance(line, dict) or line.get("type") != "run":
                    raise ImportFailed('the first line must be the run line ({"type": "run", ...})')
                hello, final = _hello(line), line["run"]
                # Checked like PATCH's; exports made before tags existed have none.
                tags = RunUpdate.model_validate({"tags": final.get("tags") or []}).tags
                store.open_run(hello)
                continue
            if isinstance(line, dict) and line.get("rank") is not None:
                rank_lines += 1
                continue
            step = _step(line, number - 1, len(hello.params))
        except ImportFailed as exc:
            raise ImportFailed(f"line {number}: {exc}") from None
        except (ValueError, KeyError, TypeError, ProtocolError) as exc:
            raise ImportFailed(f"line {number}: not a gradwatch export line ({exc})") from None
        batch.append(StepData(seq=step.seq, step=step.step, time=step.time, scalars=step.scalars, arrays=step.arrays()))
        if len(batch) >= batch_size:
            flush()
    if hello is None:
        raise ImportFailed("the file is empty")
    flush()
    # No hook will send `close` for an imported run: a run exported while running is unfinished.
    status = "finished" if final.get("status") == "finished" else "crashed"
    store.set_status(hello.run.id, status, final.get("finished_at"))
    if tags:
        store.update_run(hello.run.id, tags=tags)
    return Imported(run_id=hello.run.id, stored=stored, skipped=skipped, rank_lines=rank_lines)
