"""The `gradwatch` command: serve, runs, export, import, sync, gc.

Exit codes: 0 success, 1 the command failed (the message says what to do), 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, TYPE_CHECKING

from pydantic import ValidationError

from . import __version__
from .settings import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_SERVER, ENV_VARS, Settings, check_rank_timeout

# The store (SQLAlchemy, Alembic) is imported by the commands that open one: `gradwatch sync`
# and --help start without it, in about half the time.
if TYPE_CHECKING:
    from .store import Run, Store

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandFailed(Exception):
    """A failure the user can fix; main() prints it and exits with 1."""


#: A subcommand: parsed arguments, the environment and standard output in; the exit code out.
#: Each subparser names its own with `set_defaults(func=...)`.
Command = Callable[[argparse.Namespace, Mapping[str, str], IO[str]], int]


def _db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        help=f"database: sqlite:///path.db, a file path, or postgresql://... "
        f"(default: ${ENV_VARS['db_url']} or sqlite:///./gradwatch.db)",
    )


def _workers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (worker processes), not {value}")
    return value


def _rank_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}; pass e.g. 30") from None
    try:
        return check_rank_timeout(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradwatch",
        description="gradwatch server: store PyTorch optimizer telemetry and show it live.",
    )
    parser.add_argument("--version", action="version", version=f"gradwatch-server {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser(
        "serve",
        help="run the server and dashboard",
        description="Receive telemetry from hooks and serve the dashboard.",
    )
    serve.set_defaults(func=cmd_serve)
    _db_option(serve)
    serve.add_argument("--host", help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    serve.add_argument("--port", type=int, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--token", help=f"require this token for writes (default: ${ENV_VARS['token']})")
    serve.add_argument(
        "--allowed-hosts",
        metavar="NAMES",
        help="comma-separated host names the server answers to, * for any (default: the "
        "loopback names when bound to loopback, else any)",
    )
    serve.add_argument(
        "--workers",
        type=_workers,
        metavar="N",
        help=f"worker processes serving the port (default: ${ENV_VARS['workers']}, then 1); more "
        "than 1 needs PostgreSQL (--db postgresql://...), which passes live updates between "
        "them; SQLite stays one process",
    )
    serve.add_argument(
        "--notify",
        metavar="URL",
        action="append",
        help="POST each new error or warning finding to this webhook (Slack, Discord, ntfy "
        "with the topic as #fragment, or any receiver of JSON); repeat for several "
        f"(default: ${ENV_VARS['notify']}, comma-separated)",
    )
    serve.add_argument(
        "--public-url",
        metavar="URL",
        help="the dashboard's address as people reach it, for the links in notifications "
        f"(default: ${ENV_VARS['public_url']}, then the address served)",
    )
    serve.add_argument(
        "--rank-timeout",
        type=_rank_timeout,
        metavar="SECONDS",
        help="a rank of a distributed job that sends nothing this long while another rank is "
        "ahead is lost: the job's steps go on without it, marked partial "
        f"(default: ${ENV_VARS['rank_timeout_s']}, then 30)",
    )
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])

    runs = commands.add_parser("runs", help="list stored runs", description="List the runs in a database.")
    runs.set_defaults(func=cmd_runs)
    _db_option(runs)
    runs.add_argument("--project", help="only this project")
    runs.add_argument("--status", choices=["running", "finished", "crashed"])
    runs.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")

    export = commands.add_parser("export", help="export a run", description="Write a run's data to a file.")
    export.set_defaults(func=cmd_export)
    export.add_argument("run", metavar="RUN", help="run id (or a name only one run has)")
    export.add_argument(
        "--format",
        choices=["csv", "json", "parquet"],
        default="csv",
        help="csv (one row per step and parameter), json (JSON lines, re-importable), parquet",
    )
    export.add_argument(
        "--table",
        choices=["params", "steps"],
        default="params",
        help="params (one row per step and parameter) or steps (one row per step, one column "
        "per scalar: loss, learning rates, grad_norm_total, memory, your scalars)",
    )
    export.add_argument(
        "--ranks",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a distributed job's run: also each rank's own rows, with a `rank` column (default); "
        "--no-ranks writes the job's global rows alone",
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write here (default: standard output)")
    _db_option(export)

    imp = commands.add_parser(
        "import", help="load an exported run", description="Load a run exported with --format json into the database."
    )
    imp.set_defaults(func=cmd_import)
    imp.add_argument("file", metavar="FILE", help="JSON-lines export, or - for standard input")
    _db_option(imp)

    sync = commands.add_parser(
        "sync",
        help="send spooled hook data to a server",
        description="Replay telemetry the hook spooled while no server was reachable: runs "
        "the hook's `python -m gradwatch sync` (needs the hook, pip install "
        "gradwatch) and exits with its status.",
    )
    sync.set_defaults(func=cmd_sync)
    sync.add_argument("--server", metavar="URL", help=f"server URL (default: $GRADWATCH_SERVER, then {DEFAULT_SERVER})")
    sync.add_argument(
        "--spool", metavar="DIR", help="spool folder (default: $GRADWATCH_SPOOL, then ~/.gradwatch/spool)"
    )
    sync.add_argument("--token", metavar="T", help="the server's token (default: $GRADWATCH_TOKEN)")

    gc = commands.add_parser(
        "gc",
        help="delete old or crashed runs and compact the database",
        description="Delete the runs chosen by --older-than and/or --crashed (each with all its data, in one "
        "transaction; never a running run), then give the space back: VACUUM on SQLite (it rewrites "
        "the file: it needs as much free disk, and a moment without a server writing), VACUUM (ANALYZE) "
        "on PostgreSQL. Without --older-than or --crashed it only compacts. Deleting asks for --yes "
        "(or a y on a terminal); --dry-run lists what would go.",
    )
    gc.set_defaults(func=cmd_gc)
    _db_option(gc)
    gc.add_argument(
        "--older-than",
        metavar="DAYS",
        type=_days,
        help="delete the runs created more than DAYS days ago (a decimal, e.g. 0.5)",
    )
    gc.add_argument("--crashed", action="store_true", help="delete crashed runs (with --older-than: the older ones)")
    gc.add_argument("--project", help="only runs of this project (with --older-than or --crashed)")
    confirm = gc.add_mutually_exclusive_group()
    confirm.add_argument("--dry-run", action="store_true", help="list what would be deleted; change nothing")
    confirm.add_argument("-y", "--yes", action="store_true", help="delete without asking")
    gc.add_argument("--no-vacuum", action="store_true", help="delete only; do not compact")
    return parser


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 or more days, not {text}")
    return value


def _store(args: argparse.Namespace, env: Mapping[str, str]) -> Store:
    from .store import open_store

    return open_store(Settings.from_env(env, db_url=args.db).db_url)


def _find_run(store: Store, ref: str) -> Run:
    run = store.get_run(ref)
    if run is not None:
        return run
    matches = [r for r in store.list_runs(q=ref, limit=1000)[0] if r.name == ref]
    if len(matches) == 1:
        return matches[0]
    if matches:
        ids = ", ".join(r.id for r in matches)
        raise CommandFailed(f"several runs are named {ref!r} ({ids}); pass the run id")
    raise CommandFailed(f"no run {ref!r} in this database; `gradwatch runs` lists them")


def cmd_serve(args: argparse.Namespace, env: Mapping[str, str], out: IO[str]) -> int:
    settings = Settings.from_env(
        env,
        db_url=args.db,
        host=args.host,
        port=args.port,
        token=args.token,
        allowed_hosts=args.allowed_hosts,
        workers=args.workers,
        notify=args.notify,
        public_url=args.public_url,
        rank_timeout_s=args.rank_timeout,
    )
    # The app (FastAPI, the store, the diagnostics: about a second) once the settings are valid:
    # a bad one is refused at once.
    from . import serving, workers
    from .app import create_app
    from .store import display_url, open_store

    problem = workers.refusal(settings)
    if problem:
        print(f"gradwatch: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    open_store(settings.db_url).close()  # fail here, with a clear message, if the database is unusable
    if settings.host not in ("127.0.0.1", "localhost", "::1") and settings.token is None:
        print(
            f"gradwatch: warning: listening on {settings.host} without --token: anyone who can reach "
            "this port can write runs",
            file=sys.stderr,
        )
    workers.configure_logging(args.log_level)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    several = f", {settings.workers} workers" if settings.workers > 1 else ""
    print(
        f"gradwatch: dashboard at http://{host}:{settings.port}/  (database {display_url(settings.db_url)}{several})",
        file=out,
        flush=True,
    )
    try:
        if settings.workers > 1:
            if not workers.serve(settings, args.log_level):
                raise CommandFailed("the worker processes could not start (see above)")
        else:
            serving.run(
                create_app(settings),
                host=settings.host,
                port=settings.port,
                log_level=args.log_level,
                ws_max_size=settings.max_frame_bytes,
            )
    except SystemExit as exc:  # uvicorn exits 3 when it cannot start, e.g. on a port in use
        if exc.code:
            raise CommandFailed(
                f"the server could not start on {host}:{settings.port} (see above); "
                "if the port is in use, stop the other server or pass --port"
            ) from None
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, env: Mapping[str, str], out: IO[str]) -> int:
    store = _store(args, env)
    try:
        found, count = store.list_runs(project=args.project, status=args.status, limit=args.limit)
    finally:
        store.close()
    if not found:
        print("no runs", file=out)
        return EXIT_OK
    rows = [
        (r.id, r.name, r.project, r.status, str(r.steps), time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at)))
        for r in found
    ]
    header = ("ID", "NAME", "PROJECT", "STATUS", "STEPS", "CREATED")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)
    if count > len(found):
        print(f"({count - len(found)} more; use --limit)", file=out)
    return EXIT_OK


@contextlib.contextmanager
def _progress(total: int, enabled: bool, unit: str = "step") -> Iterator[Callable[[int], None] | None]:
    """A tqdm bar on stderr when tqdm is installed and output goes to a file."""
    try:
        from tqdm import tqdm
    except ImportError:
        enabled = False
    if not enabled:
        yield None
        return
    with tqdm(total=total, unit=unit, file=sys.stderr) as bar:
        yield bar.update


def cmd_export(args: argparse.Namespace, env: Mapping[str, str], out: IO[str]) -> int:
    from .exporters import FORMATS, export_steps
    from .step_table import STEP_FORMATS

    if args.output is None and args.format == "parquet" and out.isatty():
        raise CommandFailed("refusing to write Parquet to a terminal; pass -o FILE")
    store = _store(args, env)
    try:
        run = _find_run(store, args.run)
        fmt = (STEP_FORMATS if args.table == "steps" else FORMATS)[args.format]
        with _progress(export_steps(store, run, args.ranks), args.output is not None) as progress:
            chunks = fmt.write(store, run, progress, ranks=args.ranks)
            if args.output is None:
                sink = out.buffer if hasattr(out, "buffer") else None
                for chunk in chunks:
                    if sink is not None:
                        sink.write(chunk)
                    else:
                        out.write(chunk.decode())
                out.flush()
            else:
                with open(args.output, "wb") as f:
                    for chunk in chunks:
                        f.write(chunk)
    finally:
        store.close()
    if args.output is not None:
        print(f"wrote run {run.id} to {args.output}", file=sys.stderr)
    return EXIT_OK


def cmd_import(args: argparse.Namespace, env: Mapping[str, str], out: IO[str]) -> int:
    from .importer import ImportFailed, import_jsonl

    store = _store(args, env)
    try:
        with contextlib.nullcontext(sys.stdin) if args.file == "-" else open(args.file, encoding="utf-8") as f:
            result = import_jsonl(store, f)
    except ImportFailed as exc:
        raise CommandFailed(f"cannot import {args.file}: {exc}") from None
    except OSError as exc:
        raise CommandFailed(f"cannot read {args.file}: {exc.strerror}") from None
    finally:
        store.close()
    ranks = f"; {result.rank_lines} steps of its ranks left out (the job's global steps are imported)"
    print(
        f"imported run {result.run_id}: {result.stored} steps stored, {result.skipped} already there"
        + (ranks if result.rank_lines else ""),
        file=out,
    )
    return EXIT_OK


def cmd_sync(args: argparse.Namespace, env: Mapping[str, str], out: IO[str]) -> int:
    """Run the hook's `python -m gradwatch sync`: the spool and its replay belong to the hook, and
    this package never imports it (a training machine needs the hook alone to sync)."""
    if importlib.util.find_spec("gradwatch") is None:
        raise CommandFailed(
            "sync replays the hook's spool: run it where the hook is installed "
            "(pip install gradwatch), as `gradwatch-sync` or `python -m gradwatch sync`"
        )
    command = [sys.executable, "-m", "gradwatch", "sync"]
    for option, value in (("--server", args.server), ("--spool", args.spool), ("--token", args.token)):
        if value is not None:
            command += [option, value]
    out.flush()
    return subprocess.run(command, env=dict(env), check=False).returncode


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def cmd_gc(args: argparse.Namespace, env: Mapping[str, str], out: IO[str]) -> int:
    """Delete the chosen runs (after confirmation), then compact the database."""
    from .store import display_url, open_store

    selecting = args.older_than is not None or args.crashed
    if args.project is not None and not selecting:
        print("gradwatch gc: error: --project narrows --older-than or --crashed; give one of them", file=sys.stderr)
        return EXIT_USAGE
    url = Settings.from_env(env, db_url=args.db).db_url
    store = open_store(url)
    try:
        chosen: list[Run] = []
        if selecting:
            before = None if args.older_than is None else time.time() - args.older_than * 86400
            chosen = store.runs_to_collect(
                created_before=before, status="crashed" if args.crashed else None, project=args.project
            )
            for r in chosen:
                created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))
                print(f"{r.id}  {r.name}  {r.project}  {r.status}  {r.steps} steps  {created}", file=out)
            steps = sum(r.steps for r in chosen)
            verb = "would delete" if args.dry_run else "deleting"
            print(f"{verb} {len(chosen)} runs ({steps:,} steps)" if chosen else "no run to delete", file=out)
        size = store.database_bytes()
        if args.dry_run:
            what = "" if args.no_vacuum else f"; would compact the database ({_mib(size)} now)"
            print(f"dry run: nothing changed{what}", file=out)
            return EXIT_OK
        if chosen and not args.yes:
            if not sys.stdin.isatty():
                print(
                    "gradwatch gc: error: deleting runs needs --yes (or a terminal to answer); --dry-run lists them",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            if input(f"Delete these {len(chosen)} runs and all their data? [y/N] ").strip().lower() not in ("y", "yes"):
                print("nothing deleted", file=out)
                return EXIT_OK
        with _progress(len(chosen), enabled=len(chosen) > 1 and sys.stderr.isatty(), unit="run") as advance:
            for r in chosen:
                store.delete_run(r.id)
                if advance is not None:
                    advance(1)
        if chosen:
            print(f"deleted {len(chosen)} runs", file=out)
        if not args.no_vacuum:
            print(f"compacting {display_url(url)} ({_mib(size)})...", file=out, flush=True)
            store.compact()
            print(f"compacted: {_mib(size)} -> {_mib(store.database_bytes())}", file=out)
    finally:
        store.close()
    return EXIT_OK


def _failures() -> tuple[type[Exception], ...]:
    """The errors a user can fix: CommandFailed, and StoreError where the command imported the
    store (one that did not cannot raise it)."""
    store = sys.modules.get(f"{__package__}.store")
    error: type[Exception] | None = getattr(store, "StoreError", None)
    return (CommandFailed,) if error is None else (CommandFailed, error)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env = os.environ if env is None else env
    command: Command = args.func
    try:
        return command(args, env, sys.stdout)
    except _failures() as exc:
        print(f"gradwatch: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ValidationError as exc:  # a bad option or environment value, e.g. --port 70000
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"gradwatch: error: invalid setting: {problems}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gradwatch export RUN | head`: the reader had enough
        sys.stderr.close()
        return EXIT_OK
