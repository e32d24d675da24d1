"""The database engine: URLs, SQLite's pragmas and write-ahead log, size and compaction."""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

from ..schema import metadata
from .records import StoreError

#: How long a SQLite connection waits for another process's write (e.g. `gradwatch import`)
#: instead of failing, in ms.
BUSY_TIMEOUT_MS = 10000


def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # First: switching a new file to WAL takes a lock too, which another process starting at the
    # same moment may hold.
    cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # WAL: readers (dashboard, exports) never block the writer (ingest), nor it them.
    _enable_wal(cursor)
    # NORMAL: in WAL mode a commit survives a crash of the process; only an OS crash or power
    # loss can undo the last commits, and fsync on every step would cost far more.
    cursor.execute("PRAGMA synchronous=NORMAL")
    # SQLite ignores foreign keys unless asked; deleting a run relies on ON DELETE CASCADE.
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _enable_wal(cursor: Any, wait_s: float = 10.0) -> None:
    """PRAGMA journal_mode=WAL, tried again while the file is locked (for up to `wait_s`): when
    processes start together on a new file, the busy timeout does not cover every moment of
    another one switching it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _engine_url(url: str) -> str:
    """postgresql:// means psycopg 3 (the `postgres` extra), not SQLAlchemy's psycopg2 default."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def display_url(url: str) -> str:
    """`url` with its password replaced by ***: messages and logs must not carry it."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return re.sub(r"(//[^/@]*?:)[^/@]*@", r"\1***@", url)


def create_db_engine(url: str) -> Engine:
    """An engine for `url`; SQLite files get their pragmas, and a missing folder a clear error."""
    try:
        engine = create_engine(_engine_url(url))
    except (ArgumentError, ValueError) as exc:
        raise StoreError(f"cannot use database URL {display_url(url)!r}: {exc}") from exc
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        raise StoreError(
            f"no driver for {display_url(url)!r} ({exc}); for PostgreSQL: pip install 'gradwatch-server[postgres]'"
        ) from exc
    if engine.dialect.name == "sqlite":
        database = engine.url.database
        if database and database != ":memory:" and not Path(database).parent.exists():
            raise StoreError(f"cannot create {database}: the folder {Path(database).parent} does not exist")
        event.listen(engine, "connect", _set_sqlite_pragmas)
    return engine


def database_bytes(engine: Engine) -> int:
    """Disk the database takes: the SQLite file and its write-ahead log, or PostgreSQL's
    pg_database_size."""
    if engine.dialect.name == "sqlite":
        name = engine.url.database
        if not name or name == ":memory:":
            return 0
        return sum(
            Path(f"{name}{suffix}").stat().st_size for suffix in ("", "-wal") if Path(f"{name}{suffix}").exists()
        )
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


def compact(engine: Engine) -> None:
    """Give back the space of deleted rows.

    SQLite: checkpoint the write-ahead log into the file, VACUUM (the file is rewritten
    without its free pages: it needs as much free disk as the file and no other writer for
    that time) and truncate the log. PostgreSQL: VACUUM (ANALYZE) gradwatch's tables: their
    free space is reused by new rows and the planner's statistics are fresh; the files do
    not shrink (VACUUM FULL would, locking each table while it rewrites it).
    """
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                conn.exec_driver_sql("VACUUM")
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            else:
                names = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
                conn.exec_driver_sql(f"VACUUM (ANALYZE) {names}")
    except OperationalError as exc:
        raise StoreError(
            f"could not compact the database ({exc.orig}); another process may be writing "
            "to it (a server): run `gradwatch gc` again when it is idle or stopped"
        ) from exc
