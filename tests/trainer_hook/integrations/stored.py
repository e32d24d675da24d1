"""What the server stored for a run, read back through its public API, and the checks every
framework test makes against its oracle."""

from __future__ import annotations

import csv
import io
import math
import time
from typing import Any

import httpx
import torch

#: (optimizer step, parameter name) -> gradient norm
Norms = dict[tuple[int, str], float]


def grad_norms(params: dict[str, torch.Tensor], step: int) -> Norms:
    """The oracle: torch.linalg.vector_norm of each `.grad` as it stands now (None left out)."""
    return {
        (step, name): float(torch.linalg.vector_norm(p.grad.detach().float()))
        for name, p in params.items()
        if p.grad is not None
    }


def run_info(server_url: str, run_id: str) -> dict[str, Any]:
    with httpx.Client(base_url=server_url, timeout=30) as http:
        return http.get(f"/api/runs/{run_id}").raise_for_status().json()


def listed_status(server_url: str, run_id: str, wait_s: float = 0.0) -> str | None:
    """The run's status as GET /api/runs lists it; None if it is not listed within `wait_s`
    seconds (a run is listed once its hello has arrived)."""
    deadline = time.monotonic() + wait_s
    with httpx.Client(base_url=server_url, timeout=30) as http:
        while True:
            runs = http.get("/api/runs").raise_for_status().json()["data"]
            status = next((str(r["status"]) for r in runs if r["id"] == run_id), None)
            if status is not None or time.monotonic() >= deadline:
                return status
            time.sleep(0.1)


def stored_norms(server_url: str, run_id: str) -> Norms:
    """The run's CSV export: grad_norm per (step, param), where one was measured."""
    with httpx.Client(base_url=server_url, timeout=30) as http:
        text = http.get(f"/api/runs/{run_id}/export", params={"format": "csv"}).raise_for_status().text
    return {
        (int(r["step"]), r["param"]): float(r["grad_norm"])
        for r in csv.DictReader(io.StringIO(text))
        if r["grad_norm"] != ""
    }


def scalar_series(server_url: str, run_id: str, key: str) -> dict[str, Any]:
    with httpx.Client(base_url=server_url, timeout=30) as http:
        return http.get(f"/api/runs/{run_id}/series", params={"key": key}).raise_for_status().json()


def assert_equal_norms(stored: Norms, oracle: Norms, rel: float = 1e-5) -> None:
    """The same (step, param) keys, each norm equal to the oracle's to `rel` (float32)."""
    assert sorted(stored) == sorted(oracle)
    wrong = {
        k: (stored[k], oracle[k]) for k in oracle if not math.isclose(stored[k], oracle[k], rel_tol=rel, abs_tol=1e-12)
    }
    assert not wrong, f"stored != oracle at {len(wrong)} (step, param): {dict(list(wrong.items())[:5])}"


def assert_no_problem(found: list[dict[str, Any]]) -> None:
    """A correct loop: no error or warning finding."""
    bad = [(f["code"], f["severity"], f["message"]) for f in found if f["severity"] in ("error", "warning")]
    assert not bad, bad


def accumulation(found: list[dict[str, Any]]) -> float | None:
    """K of the `grad_accumulation` finding (backward passes per step), None without one."""
    for f in found:
        if f["code"] == "grad_accumulation":
            return float(f["figure"]["value"])
    return None
