"""HTTP and websocket routes, one module per resource; `router` holds them all."""

from __future__ import annotations

from fastapi import APIRouter

from . import diagnostics, export, health, ranks, runs, series, websockets

router = APIRouter()
for module in (health, runs, ranks, series, export, diagnostics):
    router.include_router(module.router, prefix="/api")
router.include_router(websockets.router)
