"""The FastAPI application: `create_app(settings)`; the store is opened in the lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from . import __version__
from .api import router
from .charts import NotFound, TooLong
from .cost import StepCost
from .deps import RunNotFound
from .diagnostics import Diagnostics
from .jobs.assembler import JobAssembler
from .live import LiveHub
from .notify import Notifier
from .security import HostGuard, default_allowed_hosts
from .sessions import Sessions
from .settings import Settings
from .store import open_store
from .views import find_frontend, mount_dashboard


def _validation_detail(exc: RequestValidationError) -> str:
    """Validation errors as one readable line: 'max_points: Input should be greater than ...'."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "path", "body"))
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(parts)


async def _invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": _validation_detail(exc)}, status_code=422)


async def _not_found(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=404)


async def _too_long(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=422)


async def _run_not_found(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RunNotFound)
    return JSONResponse(exc.body(), status_code=404)


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await asyncio.to_thread(open_store, settings.db_url)
        relay = None
        if settings.workers > 1:  # one of several worker processes: live updates go through PostgreSQL
            from .relay import Relay  # needs psycopg, which SQLite users may not have

            try:
                relay = Relay(settings.db_url, store, settings.live_queue_size)
                await relay.start()
            except BaseException:
                store.close()
                raise
        hub = LiveHub(settings.live_queue_size) if relay is None else relay.hub
        sessions = Sessions(store, hub, settings.crash_grace_s, presence=relay, rank_grace_s=settings.rank_timeout_s)
        app.state.store, app.state.hub, app.state.sessions = store, hub, sessions
        app.state.diagnostics = Diagnostics(store, sole_writer=relay is None)
        app.state.step_cost = StepCost()
        notifier = Notifier(settings.notify, settings.dashboard_url()) if settings.notify else None
        app.state.notifier = notifier
        jobs = JobAssembler(store, hub, app.state.diagnostics, settings.rank_timeout_s, notifier, coordinator=relay)
        if relay is not None:
            relay.jobs = jobs
        app.state.jobs = jobs
        sessions.watch(await asyncio.to_thread(store.running_run_ids))
        jobs.start()
        try:
            yield
        finally:
            await jobs.close()
            await sessions.close()
            if notifier is not None:  # what is queued gets a moment to go out
                await asyncio.to_thread(notifier.close, 2.0)
            if relay is not None:
                await relay.close()
            store.close()

    app = FastAPI(
        title="gradwatch",
        version=__version__,
        summary="Live PyTorch optimizer and gradient telemetry",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(RunNotFound, _run_not_found)
    app.add_exception_handler(TooLong, _too_long)
    app.include_router(router)
    allowed: Collection[str] | None
    if settings.allowed_hosts is None:
        allowed = default_allowed_hosts(settings.host)
    else:
        allowed = None if "*" in settings.allowed_hosts else settings.allowed_hosts
    app.add_middleware(HostGuard, allowed_hosts=allowed)
    mount_dashboard(app, find_frontend(settings.frontend_dir))
    return app
