"""FastAPI dependencies: the app's shared objects, the run of a path, the write token.

The objects live on ``app.state`` (set in `app.create_app`'s lifespan), so routes declare
what they need (`StoreDep`, `RunDep`) and tests build apps with their own settings.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Path
from starlette.requests import HTTPConnection

from .cost import StepCost
from .diagnostics import Diagnostics
from .jobs.assembler import JobAssembler
from .live import LiveHub
from .notify import Notifier
from .sessions import Sessions
from .settings import Settings
from .store import Run, Store


def get_settings(conn: HTTPConnection) -> Settings:
    settings: Settings = conn.app.state.settings
    return settings


def get_store(conn: HTTPConnection) -> Store:
    store: Store = conn.app.state.store
    return store


def get_hub(conn: HTTPConnection) -> LiveHub:
    hub: LiveHub = conn.app.state.hub
    return hub


def get_sessions(conn: HTTPConnection) -> Sessions:
    sessions: Sessions = conn.app.state.sessions
    return sessions


def get_diagnostics(conn: HTTPConnection) -> Diagnostics:
    diagnostics: Diagnostics = conn.app.state.diagnostics
    return diagnostics


def get_step_cost(conn: HTTPConnection) -> StepCost:
    step_cost: StepCost = conn.app.state.step_cost
    return step_cost


def get_notifier(conn: HTTPConnection) -> Notifier | None:
    """The webhook notifier; None when `serve` was given no --notify URL."""
    notifier: Notifier | None = getattr(conn.app.state, "notifier", None)
    return notifier


def get_jobs(conn: HTTPConnection) -> JobAssembler:
    jobs: JobAssembler = conn.app.state.jobs
    return jobs


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
HubDep = Annotated[LiveHub, Depends(get_hub)]
SessionsDep = Annotated[Sessions, Depends(get_sessions)]
DiagnosticsDep = Annotated[Diagnostics, Depends(get_diagnostics)]
StepCostDep = Annotated[StepCost, Depends(get_step_cost)]
NotifierDep = Annotated[Notifier | None, Depends(get_notifier)]
JobsDep = Annotated[JobAssembler, Depends(get_jobs)]

RunIdPath = Annotated[str, Path(description="the run's id, chosen by the hook")]


def token_ok(settings: Settings, authorization: str | None) -> bool:
    """Whether an Authorization header carries the server's token (always true without one)."""
    if settings.token is None:
        return True
    scheme, _, credentials = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), settings.token.encode())


def require_token(conn: HTTPConnection, settings: SettingsDep) -> None:
    """Writes (delete, rename) need the token when the server has one."""
    if not token_ok(settings, conn.headers.get("authorization")):
        raise HTTPException(
            401,
            "this server needs its token: send 'Authorization: Bearer TOKEN'",
            headers={"WWW-Authenticate": "Bearer"},
        )


class RunNotFound(LookupError):
    """No run of that id: a 404 whose body says whether it was deleted (app.py answers it)."""

    def __init__(self, run_id: str, deleted_at: float | None) -> None:
        self.run_id, self.deleted_at = run_id, deleted_at
        super().__init__(
            f"run {run_id!r} was deleted; GET /api/runs lists the runs there are"
            if deleted_at is not None
            else f"no run with id {run_id!r}; GET /api/runs lists them"
        )

    def body(self) -> dict[str, object]:
        """{detail, run: "deleted" | "unknown", deleted_at (Unix seconds, when deleted)}: a page can
        say the run is gone rather than wait for it to arrive."""
        found: dict[str, object] = {"detail": str(self), "run": "deleted" if self.deleted_at is not None else "unknown"}
        if self.deleted_at is not None:
            found["deleted_at"] = self.deleted_at
        return found


def get_run(run_id: RunIdPath, store: StoreDep) -> Run:
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFound(run_id, store.deleted_at(run_id))
    return run


RunDep = Annotated[Run, Depends(get_run)]
TokenDep = Depends(require_token)
