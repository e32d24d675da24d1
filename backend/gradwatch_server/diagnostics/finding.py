"""What a check reports: a `Finding` (code, severity, one-sentence message, parameters, first
step, figure), and the small text helpers the messages share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Figure:
    """The one number that sizes a finding: `value` in `unit`, `text`, how it reads, and `step`,
    the step at which it holds (a run goes on after a finding: the figure is not its current state)."""

    label: str  # what the number is, e.g. "bytes held between steps"
    value: float
    unit: str  # "bytes", "passes", "steps", "ratio"
    text: str  # e.g. "1.5 MiB"
    step: int | None = None
    #: what the finding rests on, for the incident view (JSON values: steps, parameters and their
    #: ratios and scores); only the instability findings (spikes.py) have it
    evidence: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: a non-finite value is "NaN", "Infinity" or "-Infinity", as everywhere in the API."""
        out: dict[str, Any] = {
            "label": self.label,
            "value": json_float(self.value),
            "unit": self.unit,
            "text": self.text,
            "step": self.step,
        }
        if self.evidence is not None:
            out["evidence"] = _json_safe(self.evidence)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Figure:
        step = data.get("step")
        return cls(
            label=str(data["label"]),
            value=float(data["value"]),
            unit=str(data["unit"]),
            text=str(data["text"]),
            step=None if step is None else int(step),
            evidence=data.get("evidence") if isinstance(data.get("evidence"), dict) else None,
        )


@dataclass(frozen=True)
class Finding:
    """One diagnosis of a run. Its `code` is one of those in docs/diagnostics.md."""

    code: str
    severity: Severity
    message: str
    params: tuple[str, ...] = ()
    first_step: int | None = None
    figure: Figure | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        """The public JSON shape (GET .../diagnostics, the `finding` websocket messages)."""
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "params": list(self.params),
            "first_step": self.first_step,
            "figure": None if self.figure is None else self.figure.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        fig = data.get("figure")
        severity: Severity = data["severity"] if data["severity"] in SEVERITIES else "info"
        return cls(
            code=data["code"],
            severity=severity,
            message=data["message"],
            params=tuple(data.get("params") or ()),
            first_step=data.get("first_step"),
            figure=None if not fig else Figure.from_dict(fig),
        )


def json_float(x: float) -> float | str:
    """A float as the API writes it: non-finite values as the strings "NaN", "Infinity", "-Infinity"."""
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _json_safe(value: Any) -> Any:
    """`value` with every non-finite float written as `json_float` writes it."""
    if isinstance(value, float):
        return json_float(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 parameter', '3 parameters'."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def name_list(names: Sequence[str], shown: int = 3) -> str:
    """'a', 'a and b', 'a, b, c and 2 more': parameter names for a sentence."""
    names = list(names)
    if len(names) <= shown:
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return ", ".join(names[:shown]) + f" and {len(names) - shown} more"


def fmt_bytes(n: float) -> str:
    """'512 B', '1.5 KiB', '3 MiB' (binary units, as the dashboard writes them)."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" or size == int(size) else f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} TiB"  # pragma: no cover (the loop returns)


def fmt_num(x: float) -> str:
    """A short number for a sentence: '65536', '0.0001', '3.2e+07'."""
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")
    return f"{x:.4g}"
