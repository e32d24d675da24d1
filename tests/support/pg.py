"""A real, throwaway PostgreSQL server for the tests, and a fresh database per test.

`TempCluster.start()` runs Debian's `initdb` and `pg_ctl` (from /usr/lib/postgresql/<version>/bin,
which `scripts/install-system-deps.sh` installs) on a data directory under /tmp, on a free port,
listening on 127.0.0.1 only, with its unix socket inside that directory. PostgreSQL refuses to run
as root, so when the tests run as root the cluster runs as the `postgres` user (`runuser`).
Loopback connections are trusted: the cluster lives as long as the test session and holds only
test data. Durability is switched off (`fsync`, `synchronous_commit`, `full_page_writes`): a
crash loses a throwaway cluster, and the tests run faster.

The cluster has one database, `gradwatch_test` (its `url`); `create_database()` makes another,
empty one per test and returns its URL; `drop_database(url)` removes it. `ExternalServer` does
the same on the server named by GRADWATCH_TEST_POSTGRES_URL, whose role must be allowed to
create databases. A session that is killed cannot stop its cluster (`pg_ctl` detaches it): the
next session stops and deletes it (`reap_stale_clusters`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from sqlalchemy.engine import make_url

INSTALL_HINT = (
    "`make test` installs it (scripts/install-system-deps.sh installs Debian's postgresql, "
    "the Makefile installs ./backend[postgres]); or set GRADWATCH_TEST_POSTGRES_URL to a "
    "server where that role may create databases; `pytest -m 'not postgres'` leaves "
    "these tests out"
)
DB_PREFIX = "gradwatch_test"
CLUSTER_PREFIX = "gradwatch-pg-"
OWNER_FILE = "owner.pid"  # the test session's pid: a cluster whose session is gone is stale
START_TIMEOUT_S = 60


class PostgresUnavailable(RuntimeError):
    """PostgreSQL (or its Python driver) is missing, or the cluster does not start."""


def required(environ: Mapping[str, str]) -> bool:
    """Whether the PostgreSQL tests must run: in CI (CI=true), where a skip would hide that a
    whole database went untested; elsewhere a machine without PostgreSQL skips them, saying why."""
    return environ.get("CI", "").strip().lower() in ("true", "1", "yes")


class Server(Protocol):
    url: str

    def create_database(self) -> str: ...
    def drop_database(self, url: str) -> None: ...
    def stop(self) -> None: ...


def find_bin_dir() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin with initdb, else initdb on PATH."""
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    if found:
        return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _connect(url: str):  # type: ignore[no-untyped-def]
    try:
        import psycopg
    except ModuleNotFoundError:
        raise PostgresUnavailable(f"the PostgreSQL driver psycopg is not installed; {INSTALL_HINT}") from None
    return psycopg.connect(url, autocommit=True, connect_timeout=10)


class _Databases:
    """CREATE/DROP DATABASE through the server's maintenance connection `url`."""

    url: str
    _names = itertools.count(1)

    def create_database(self) -> str:
        name = f"{DB_PREFIX}_{os.getpid()}_{next(self._names)}"
        with _connect(self.url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def drop_database(self, url: str) -> None:
        """Drop a database made by `create_database`, closing what is still connected to it."""
        name = make_url(url).database
        assert name and name.startswith(DB_PREFIX + "_"), name
        with _connect(self.url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class ExternalServer(_Databases):
    """A server someone else runs (GRADWATCH_TEST_POSTGRES_URL): only test databases are touched."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:  # fail early, with the driver's message, if it cannot be reached
            _connect(url).close()
        except PostgresUnavailable:
            raise
        except Exception as exc:  # psycopg.OperationalError, without importing psycopg here
            raise PostgresUnavailable(f"GRADWATCH_TEST_POSTGRES_URL cannot be reached: {exc}") from None

    def stop(self) -> None:
        pass


class TempCluster(_Databases):
    """A PostgreSQL cluster in a temporary directory; `stop()` shuts it down and deletes it."""

    def __init__(self, bin_dir: Path, root: Path | None = None) -> None:
        self.bin_dir = bin_dir
        self.root = root or Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX))
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        self.port = 0
        self.url = ""
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user:
            try:
                entry = pwd.getpwnam(self._user)
            except KeyError:
                raise PostgresUnavailable(f"no `postgres` user to run PostgreSQL as; {INSTALL_HINT}") from None
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)
        if root is None:
            (self.root / OWNER_FILE).write_text(str(os.getpid()))

    def _run(self, *args: str, timeout: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self._user:
            command = ["runuser", "-u", self._user, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def start(self) -> TempCluster:
        result = self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"initdb failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        for _ in range(3):  # the port was free a moment ago; another process may take it first
            self.port = _free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -k {shlex.quote(str(self.root))} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            result = self._run(
                "pg_ctl",
                "-D",
                str(self.data),
                "-l",
                str(self.log_path),
                "-o",
                options,
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "start",
                timeout=START_TIMEOUT_S + 10,
            )
            if result.returncode == 0:
                with _connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres") as conn:
                    conn.execute(f'CREATE DATABASE "{DB_PREFIX}"')
                self.url = f"postgresql://postgres@127.0.0.1:{self.port}/{DB_PREFIX}"
                return self
            time.sleep(0.2)
        log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        self.stop()
        raise PostgresUnavailable(f"pg_ctl start failed ({result.returncode}):\n{result.stdout}{result.stderr}\n{log}")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale_clusters(bin_dir: Path) -> None:
    """Stop and delete the clusters of test sessions that died without stopping them (killed,
    timed out): `pg_ctl` runs the server detached, so it outlives a killed session."""
    for root in Path(tempfile.gettempdir()).glob(CLUSTER_PREFIX + "*"):
        try:
            owner = int((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if not _alive(owner):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                TempCluster(bin_dir, root).stop()


def start_server(env_url: str | None) -> Server:
    """The server at `env_url` if given, else a new `TempCluster`; raises PostgresUnavailable."""
    if env_url:
        return ExternalServer(env_url)
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise PostgresUnavailable(
            f"PostgreSQL is not installed (no initdb under /usr/lib/postgresql/*/bin nor on PATH); {INSTALL_HINT}"
        )
    try:  # check the driver before making a cluster for nothing
        import psycopg  # noqa: F401
    except ModuleNotFoundError:
        raise PostgresUnavailable(f"the PostgreSQL driver psycopg is not installed; {INSTALL_HINT}") from None
    reap_stale_clusters(bin_dir)
    return TempCluster(bin_dir).start()
