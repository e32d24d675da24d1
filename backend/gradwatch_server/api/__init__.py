"""HTTP and websocket routes, one module per resource; `router` holds them all."""

from __future__ import annotations

from fastapi import APIRouter

from . import diagnostics, export, health, runs, series, websockets

router = APIRouter()
for module in (health, runs, series, export, diagnostics):
    router.include_router(module.router, prefix="/api")
router.include_router(websockets.router)
