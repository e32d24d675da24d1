"""`python -m gradwatch sync` (also the `gradwatch-sync` command): replay the spool by hand.

Runs on the training machine with the hook alone installed: no torch, no server package.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional, TextIO

from websockets.exceptions import WebSocketException

from .connection import Refused
from .options import DEFAULT_SERVER, ingest_url, server_url
from .replay import REJECTED, Rejected, replay
from .spool import pending_spools, spool_dir

#: Exit codes: everything delivered; some runs not delivered (the server is unreachable or stopped
#: answering: try again once it is up); bad usage; the server refused (a token or version to fix),
#: or a spool file could not be sent (moved aside to `<name>.rejected`).
EXIT_OK, EXIT_UNDELIVERED, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3

_EPILOG = """exit status: 0 everything delivered (or nothing to sync); 1 some runs not delivered because the
server could not be reached (their files stay: run this again once it is up); 2 bad usage; 3 the
server refused (check --token or $GRADWATCH_TOKEN), or refused a spooled message, or a spool file is
corrupt (that file is moved aside to NAME.rejected, never deleted)."""


def _sync_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server", metavar="URL", help=f"server URL (default: $GRADWATCH_SERVER, then {DEFAULT_SERVER})"
    )
    parser.add_argument("--token", metavar="T", help="the server's token (default: $GRADWATCH_TOKEN)")
    parser.add_argument(
        "--spool", metavar="DIR", help="spool folder (default: $GRADWATCH_SPOOL, then ~/.gradwatch/spool)"
    )
    parser.add_argument(
        "--timeout", metavar="S", type=float, default=30.0, help="seconds to wait for the server's answers (default 30)"
    )


_SYNC_DESCRIPTION = (
    "Send the telemetry that runs spooled while no server was reachable (or when their "
    "process was killed) to a gradwatch server, then delete what it acknowledged."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gradwatch", description="gradwatch hook commands.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sync = commands.add_parser(
        "sync", help="send spooled data to a server", description=_SYNC_DESCRIPTION, epilog=_EPILOG
    )
    _sync_arguments(sync)
    return parser


def sync_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gradwatch-sync", description=_SYNC_DESCRIPTION, epilog=_EPILOG)
    _sync_arguments(parser)
    return parser


def sync(args: argparse.Namespace, env: Mapping[str, str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    server = server_url(args.server, env)
    try:
        ws_url = ingest_url(server)
    except (TypeError, ValueError) as exc:
        print(f"gradwatch sync: error: {exc}", file=err)
        return EXIT_USAGE
    if not args.timeout > 0:
        print(f"gradwatch sync: error: --timeout must be more than 0 seconds, not {args.timeout}", file=err)
        return EXIT_USAGE
    directory = Path(args.spool) if args.spool else spool_dir(env)
    if args.spool and not directory.is_dir():
        print(
            f"gradwatch sync: error: no spool folder {directory}; runs spool under $GRADWATCH_SPOOL "
            "(default ~/.gradwatch/spool)",
            file=err,
        )
        return EXIT_USAGE
    files = pending_spools(directory)
    if not files:
        print(f"nothing to sync: no spooled runs in {directory}", file=out)
        return EXIT_OK
    token = args.token or env.get("GRADWATCH_TOKEN")
    print(f"syncing {len(files)} spooled runs from {directory} to {server}", file=out, flush=True)
    undelivered = refused = rejected = 0
    for i, path in enumerate(files, 1):
        counter = f"[{i}/{len(files)}]"
        try:
            done = replay(path, ws_url, token, timeout=args.timeout)
        except Rejected as exc:
            rejected += 1
            print(
                f"{counter} run {path.stem}: rejected: {exc.reason}; moved aside to {exc.moved} (not deleted)",
                file=err,
                flush=True,
            )
        except Refused as exc:
            refused += 1
            print(f"{counter} run {path.stem}: refused: {exc}; the spool file stays", file=err, flush=True)
        except (OSError, TimeoutError, WebSocketException, ValueError, KeyError) as exc:
            # OSError: unreachable; WebSocketException/ValueError/KeyError: an answer that is not
            # the protocol's. Either way this file stays and the next one is tried.
            undelivered += 1
            why = (
                f"{type(exc).__name__}: {exc}"
                if isinstance(exc, (WebSocketException, ValueError, KeyError))
                else str(exc) or type(exc).__name__
            )
            print(f"{counter} run {path.stem}: not delivered ({why}); the spool file stays", file=err, flush=True)
        else:
            if not done.claimed:
                print(f"{counter} run {path.stem}: skipped: a live run or another sync holds it", file=out, flush=True)
                continue
            note = f"; dropped {done.torn} at its end" if done.torn else ""
            print(f"{counter} run {path.stem}: {done.sent} messages delivered{note}", file=out, flush=True)
    if rejected:
        print(
            f"gradwatch sync: error: {rejected} of {len(files)} spooled runs could not be sent (a message the "
            f"server refused, or a corrupt record); their files are moved aside to NAME{REJECTED}, not deleted",
            file=err,
        )
    if refused:
        print(
            f"gradwatch sync: error: {server} refused {refused} of {len(files)} spooled runs: check the token "
            "(--token or $GRADWATCH_TOKEN) and that the server is as new as the hook",
            file=err,
        )
    if undelivered:
        print(
            f"gradwatch sync: error: {undelivered} of {len(files)} spooled runs could not be delivered to "
            f"{server}: is the server up (gradwatch serve)? Their files stay; run this again.",
            file=err,
        )
    if refused or rejected:
        return EXIT_REFUSED
    return EXIT_UNDELIVERED if undelivered else EXIT_OK


def main(argv: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return sync(args, os.environ if env is None else env)


def sync_main(argv: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None) -> int:
    """The `gradwatch-sync` command."""
    return sync(sync_parser().parse_args(argv), os.environ if env is None else env)


if __name__ == "__main__":
    sys.exit(main())
