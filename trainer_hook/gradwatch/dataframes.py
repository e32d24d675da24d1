"""Runs as pandas DataFrames, for notebooks and analysis: `gradwatch.load(run)`, `gradwatch.runs()`.

Read over the server's REST API with the standard library (urllib): the hook adds no HTTP client.
pandas and pyarrow are imported when these are called, never by `import gradwatch`
(`pip install gradwatch[pandas]`).
"""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Optional

from .options import http_url, server_url

PAGE = 1000  # runs per request, the API's largest `limit`
#: RunPublic's fields (docs/api.md): the columns of `runs()`, also when no run matches
RUN_COLUMNS = [
    "id",
    "name",
    "project",
    "status",
    "steps",
    "last_step",
    "created_at",
    "updated_at",
    "finished_at",
    "param_count",
    "param_numel",
    "optimizer",
    "config",
    "hook_version",
    "tags",
    "findings",
]
TIME_COLUMNS = ("created_at", "updated_at", "finished_at")


def _pandas() -> Any:
    try:
        import pandas
        import pyarrow  # noqa: F401  (pandas reads the Parquet export with it)
    except ImportError as exc:
        raise ImportError(
            f"gradwatch.load() and gradwatch.runs() need pandas and pyarrow ({exc.name} is missing): "
            "pip install gradwatch[pandas]"
        ) from exc
    return pandas


def _server(server: Optional[str]) -> str:
    """The server's http(s) base URL: `server`, else $GRADWATCH_SERVER, else the default."""
    return http_url(server_url(server))


def _get(
    base: str, path: str, params: Optional[dict[str, Any]] = None, *, run: Optional[str] = None, timeout: float = 60.0
) -> bytes:
    """GET `path` on the server; clear errors for a server that does not answer and an unknown run."""
    query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
    url = base + path + (f"?{query}" if query else "")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as exc:
        detail = _detail(exc)
        if exc.code == 404 and run is not None:
            raise LookupError(
                f"gradwatch server {base} has no run {run!r} ({detail}); gradwatch.runs() lists the runs it has"
            ) from None
        raise RuntimeError(f"gradwatch server {base} answered {exc.code} to GET {path}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionError(
            f"cannot reach the gradwatch server at {base} ({reason}); is it running "
            "(`gradwatch serve`)? Pass server=... or set GRADWATCH_SERVER"
        ) from None


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read()).get("detail")
    except (ValueError, AttributeError, OSError):
        detail = None
    return str(detail) if detail else exc.reason


def _run_id(run: Any) -> tuple[str, Optional[str]]:
    """A run id (str) or a Watcher (its id and its server)."""
    if isinstance(run, str):
        if not run.strip():
            raise ValueError("run must be a run id, like the one gradwatch.watch() prints; got an empty string")
        return run, None
    run_id, server = getattr(run, "run_id", None), getattr(run, "server", None)
    if isinstance(run_id, str):
        return run_id, server if isinstance(server, str) else None
    raise TypeError(f"run must be a run id (str) or a gradwatch Watcher, not {type(run).__name__}")


def load(run: Any, server: Optional[str] = None, *, ranks: bool = False, timeout: float = 60.0) -> Any:
    """One run's per-parameter data as a tidy DataFrame: one row per (step, parameter).

    The columns are those of the CSV export (`step`, `param`, `grad_norm`, `grad_status`,
    `param_norm`, then every other parameter metric the run has), read from the server's Parquet
    export. Metric columns are `float32[pyarrow]`, which keeps what the server keeps: `<NA>` where
    a metric does not apply (no gradient, no optimizer state yet), NaN and ±inf where they were
    measured. `df.attrs["run"]` is the run as `GET /api/runs/{id}` describes it.

    A distributed job's run gives its global values, as its dashboard does by default; with
    `ranks=True` each rank's own rows follow, and a last column `rank` says whose a row is
    (`<NA>` on the global rows): `df[df["rank"] == 1]` is what rank 1 measured of its piece.

    `run`: a run id, or a Watcher (then its server unless `server` is given). `server`: default
    $GRADWATCH_SERVER, else http://127.0.0.1:8765. Raises LookupError for a run the server does not
    have, ConnectionError when the server does not answer.
    """
    run_id, watcher_server = _run_id(run)
    pd = _pandas()
    base = _server(server or watcher_server)
    path = f"/api/runs/{urllib.parse.quote(run_id, safe='')}"
    meta = json.loads(_get(base, path, run=run_id, timeout=timeout))
    if not isinstance(ranks, bool):
        raise TypeError(f"ranks must be True or False, not {type(ranks).__name__}")
    query = {"format": "parquet", "ranks": "true" if ranks else "false"}
    body = _get(base, f"{path}/export", query, run=run_id, timeout=timeout)
    frame = pd.read_parquet(io.BytesIO(body), engine="pyarrow", dtype_backend="pyarrow")
    for column in ("param", "grad_status"):
        if column in frame:
            frame[column] = frame[column].astype("str")
    if not ranks and "rank" in frame:  # a server that predates `ranks=` sends every rank's rows
        frame = frame[frame["rank"].isna()].drop(columns="rank").reset_index(drop=True)
    frame["step"] = frame["step"].astype("int64")
    frame.attrs["run"] = meta
    return frame


def runs(
    server: Optional[str] = None,
    project: Optional[str] = None,
    *,
    status: Optional[str] = None,
    tag: Optional[str] = None,
    timeout: float = 60.0,
) -> Any:
    """The server's runs as a DataFrame, newest first, one row per run (`GET /api/runs`).

    Columns: the run fields of docs/api.md (`id`, `name`, `project`, `status`, `steps`, ...);
    `created_at`, `updated_at` and `finished_at` as UTC timestamps. `project`, `status` and `tag`
    filter as the API does.
    """
    for name, value in (("project", project), ("status", status), ("tag", tag)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    pd = _pandas()
    base = _server(server)
    rows: list[dict[str, Any]] = []
    while True:
        page = json.loads(
            _get(
                base,
                "/api/runs",
                {"project": project, "status": status, "tag": tag, "limit": PAGE, "offset": len(rows)},
                timeout=timeout,
            )
        )
        rows.extend(page["data"])
        if not page["data"] or len(rows) >= page["count"]:
            break
    frame = pd.DataFrame(rows, columns=RUN_COLUMNS + sorted({k for r in rows for k in r} - set(RUN_COLUMNS)))
    for column in TIME_COLUMNS:
        frame[column] = pd.to_datetime(frame[column].astype("float64"), unit="s", utc=True)
    return frame
