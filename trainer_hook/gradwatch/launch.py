"""`gradwatch-run`: watch a training script with no change to it.

    gradwatch-run --project gpt -- python train.py --lr 3e-4
    gradwatch-run --run ddp-1 -- torchrun --nproc-per-node 2 train.py

The command runs in place of this one (exec): its arguments, output, signals and exit status are
its own. Every Python process it starts watches its optimizers from their first step
(autowatch.py). The launcher needs no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn, Optional, TextIO

from .autowatch import ENV
from .options import DEFAULT_SERVER, check_every, check_name, ingest_url

#: The folder whose sitecustomize.py starts the watching in every Python process of the command.
SITE = Path(__file__).resolve().parent / "_site"
EXIT_USAGE = 2
EXIT_NOT_FOUND = 127  # as a shell says of a command it cannot find

_DESCRIPTION = """Run a command (python train.py ..., torchrun ..., accelerate launch ...) and watch every
torch optimizer its Python processes create, from the first step, with no change to the script: one
gradwatch run per set of optimizers (those alive when the first of them steps), one per job under
torchrun, parameters named as the model's named_parameters() names them. A script that calls
gradwatch.watch() itself is not watched twice. The command's arguments, output and exit status are
its own."""

_EPILOG = """examples:
  gradwatch-run --project gpt -- python train.py --lr 3e-4
  gradwatch-run --run ddp-1 --every 10 -- torchrun --nproc-per-node 2 train.py

exit status: the command's own; 2 bad usage; 127 the command is not found.
Not watched: a Python started with -I or -E (it ignores PYTHONPATH), and an optimizer
that exists when the first one steps but never steps itself holds that run's steps back
(call gradwatch.watch() on the ones that step)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradwatch-run",
        usage="gradwatch-run [--project P] [--run NAME] [--every N] [--server URL] -- COMMAND [ARGS...]",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--project", metavar="P", help='the runs\' project (default "default")')
    parser.add_argument(
        "--run", metavar="NAME", help="the run's name (a second set of optimizers: NAME-2); default: the time"
    )
    parser.add_argument(
        "--every",
        metavar="N",
        default="1",
        help='measure every N-th step, or "auto" (within 0.4%% of the step time); default 1',
    )
    parser.add_argument(
        "--server", metavar="URL", help=f"server URL (default: $GRADWATCH_SERVER, then {DEFAULT_SERVER})"
    )
    return parser


def _fail(parser: argparse.ArgumentParser, err: TextIO, message: str, code: int = EXIT_USAGE) -> int:
    parser.print_usage(err)
    print(f"gradwatch-run: error: {message}", file=err)
    return code


def prepare(
    argv: Sequence[str], env: Mapping[str, str], err: TextIO = sys.stderr
) -> tuple[int, list[str], dict[str, str]]:
    """(0, command, its environment), or (exit code, [], {}) having said what is wrong on `err`
    (or shown --help: 0 and no command)."""
    parser = build_parser()
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        ours, command = argv[:cut], argv[cut + 1 :]
    else:
        ours, command = argv, []
    try:
        args = parser.parse_args(ours)  # --help exits here
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_USAGE
        return code, [], {}
    if not command:
        return _fail(parser, err, "no command: put it after --, e.g. gradwatch-run -- python train.py"), [], {}
    text = args.every.strip()
    every: object = int(text) if text.lstrip("+-").isdecimal() else text
    try:  # the rules of WatchOptions, which each process's watch() checks again
        check_every(every, "--every")
        check_name("--project", args.project)
        check_name("--run", args.run)
    except ValueError as exc:
        return _fail(parser, err, str(exc)), [], {}
    if args.server is not None:
        try:
            ingest_url(args.server)
        except ValueError as exc:
            return _fail(parser, err, f"--server: {exc}"), [], {}
    if shutil.which(command[0], path=env.get("PATH")) is None:
        print(f"gradwatch-run: error: command not found: {command[0]}", file=err)
        return EXIT_NOT_FOUND, [], {}
    child = dict(env)
    child[ENV] = json.dumps({"project": args.project, "run": args.run, "every": every})
    child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH")]))
    if args.server is not None:  # the script's own watch() calls use it too
        child["GRADWATCH_SERVER"] = args.server
    return 0, command, child


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The `gradwatch-run` command: returns only on bad usage; otherwise the command replaces it."""
    code, command, env = prepare(sys.argv[1:] if argv is None else argv, os.environ)
    if code or not command:  # bad usage, or --help shown
        return code
    _exec(command, env)


def _exec(command: list[str], env: dict[str, str]) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main())
