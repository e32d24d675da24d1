"""`gradwatch serve --workers N`: N uvicorn worker processes on one port, on PostgreSQL.

The parent binds the port and supervises the workers (uvicorn's `Multiprocess`: a worker that dies
is replaced); the workers accept connections from the one listening socket, so the kernel spreads
hooks and browsers over them. uvicorn starts each worker as a fresh interpreter (multiprocessing
"spawn") that imports its app by name, so the parent passes its settings, validated once, and its
log level in one environment variable (`SETTINGS_ENV`, JSON), and each worker builds its app with
`app()`. In a worker `Settings.workers > 1`, and `create_app` then passes live updates between the
workers through PostgreSQL (relay.py).

SQLite is refused: it takes one writer at a time, so worker processes would only queue for its
lock (one process already stores on a thread of its own and serves many hooks and browsers), and
nothing would carry live updates between them.
"""

from __future__ import annotations

import json
import logging
import os

from fastapi import FastAPI
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .settings import Settings

#: The settings of `gradwatch serve --workers N`, for its worker processes (set by `serve`).
SETTINGS_ENV = "GRADWATCH_SERVE_WORKER"


def configure_logging(level: str) -> None:
    """Our loggers (gradwatch.*) beside uvicorn's: refused hooks and crashed runs show up."""
    logging.basicConfig(format="%(levelname)-9s %(name)s: %(message)s")
    logging.getLogger("gradwatch").setLevel(level.upper())


def refusal(settings: Settings) -> str | None:
    """Why these settings cannot run several workers, as a message for the user (None: they can)."""
    if settings.workers == 1:
        return None
    try:
        backend = make_url(settings.db_url).get_backend_name()
    except (ArgumentError, ValueError):
        return None  # opening the database says what is wrong with the URL
    if backend != "postgresql":
        name = {"sqlite": "SQLite"}.get(backend, backend)
        return (
            f"--workers {settings.workers} needs PostgreSQL (--db postgresql://...): {name} takes one "
            "writer at a time, so several worker processes would only wait for each other, and they could "
            "not pass live updates to each other's browsers; on SQLite leave out --workers (one process "
            "serves many hooks and browsers at once), or move the runs to PostgreSQL with "
            "`gradwatch export RUN --format json` and `gradwatch import`"
        )
    try:
        import psycopg  # noqa: F401  (the relay between workers needs psycopg 3 whatever the URL's driver)
    except ImportError:
        return "--workers needs the PostgreSQL driver psycopg 3: pip install 'gradwatch-server[postgres]'"
    return None


def serve(settings: Settings, log_level: str) -> bool:
    """Bind the port and run `settings.workers` workers until SIGINT/SIGTERM.

    Returns False if a worker failed to start (uvicorn then stops the others; the log says why).
    Raises SystemExit, as uvicorn does, if the port cannot be bound."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    os.environ[SETTINGS_ENV] = json.dumps({"settings": settings.model_dump(mode="json"), "log_level": log_level})
    config = uvicorn.Config(
        f"{__name__}:app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=log_level,
        ws_max_size=settings.max_frame_bytes,
    )
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    return not any(process.process.exitcode == STARTUP_FAILURE for process in supervisor.processes)


def app() -> FastAPI:
    """The app of one worker process: uvicorn calls this factory in each."""
    from .app import create_app
    from .serving import tune_gc

    try:
        passed = json.loads(os.environ[SETTINGS_ENV])
    except KeyError:
        raise RuntimeError(
            f"{__name__}:app is the app of `gradwatch serve --workers N`'s worker processes; "
            "run `gradwatch serve --workers N`"
        ) from None
    configure_logging(passed["log_level"])
    built = create_app(Settings.model_validate(passed["settings"]))
    tune_gc()  # as `serving.run` does for one process
    return built
