"""Query helpers shared by the store's modules: driver-level rows, bulk inserts, conditions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from ..schema import param_metrics


def plain_rows(conn: Connection, query: Any) -> list[Any]:
    """A query's rows as the driver gives them (tuples; bytes for blobs), without SQLAlchemy's
    Row objects, which cost about half the time of the long reads."""
    result = conn.execute(query)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def joined(rows: Sequence[Any], first: int) -> bytes:
    """The blobs in the columns from `first` on of every row, joined in order, a row at a time
    (bytes, or any buffer a driver gives): one join per row, not a generator of bytes()."""
    return b"".join([b"".join(r[first:]) for r in rows])


#: Fewest rows that insert_plain sends to PostgreSQL by COPY rather than executemany.
COPY_FROM = 16


def insert_plain(conn: Connection, table: Any, rows: list[tuple[Any, ...]]) -> None:
    """INSERT rows (tuples in the order of the table's columns) with the driver's executemany
    (PostgreSQL: COPY, from COPY_FROM rows): SQLAlchemy's handling of each row's parameters
    costs about as much as SQLite's insert."""
    if not rows:
        return
    names = ", ".join(c.name for c in table.columns)
    if conn.dialect.name == "postgresql" and len(rows) >= COPY_FROM:
        # COPY: one statement for all the rows, which PostgreSQL parses and plans once (a group
        # commit of a large job's frames is hundreds of rows; executemany sends each one)
        with conn.connection.dbapi_connection.cursor() as cursor:  # type: ignore[union-attr]
            with cursor.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        return
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    conn.exec_driver_sql(f"INSERT INTO {table.name} ({names}) VALUES ({', '.join([mark] * len(table.columns))})", rows)


def storable(*texts: str | None) -> bool:
    """False if a text holds U+0000: PostgreSQL cannot even compare it (SQLite can), and the
    protocol refuses it in anything stored, so a lookup by it finds nothing on either database."""
    return not any(t and "\x00" in t for t in texts)


def metric_where(run_id: str, metric: str) -> list[Any]:
    return [param_metrics.c.run_id == run_id, param_metrics.c.metric == metric]


def window(column: Any, start: int | None, end: int | None) -> list[Any]:
    """Conditions for `start <= column <= end`, either bound optional."""
    return ([column >= start] if start is not None else []) + ([column <= end] if end is not None else [])
