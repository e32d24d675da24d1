from __future__ import annotations

import os

from fastapi import APIRouter

from .. import __version__
from ..models import Health

router = APIRouter(tags=["health"])


@router.get("/health")
def health() -> Health:
    """200 while the server is up (the tests and `make demo` poll it)."""
    return Health(version=__version__, worker=os.getpid())
