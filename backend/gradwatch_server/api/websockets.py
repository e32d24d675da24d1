"""Websockets: /ws/ingest (hooks send telemetry) and /ws/live (browsers follow runs)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, WebSocket

from ..deps import DiagnosticsDep, HubDep, JobsDep, NotifierDep, SessionsDep, SettingsDep, StepCostDep, StoreDep
from ..ingest import IngestConnection
from ..live import pump, worker_headers
from ..protocol import RUN_ID_PATTERN

router = APIRouter(tags=["websockets"])


@router.websocket("/ws/ingest")
async def ingest(
    websocket: WebSocket,
    store: StoreDep,
    hub: HubDep,
    sessions: SessionsDep,
    settings: SettingsDep,
    diagnostics: DiagnosticsDep,
    step_cost: StepCostDep,
    notifier: NotifierDep,
    jobs: JobsDep,
) -> None:
    await IngestConnection(websocket, store, hub, sessions, settings, diagnostics, step_cost, notifier, jobs).serve()


@router.websocket("/ws/live")
async def live(
    websocket: WebSocket, hub: HubDep, run: Annotated[str | None, Query(pattern=RUN_ID_PATTERN)] = None
) -> None:
    """Run events for every browser; with `run`, that run's steps too."""
    await websocket.accept(headers=worker_headers())
    sub = hub.subscribe(run)
    try:
        await pump(websocket, sub)
    finally:
        hub.unsubscribe(sub)
