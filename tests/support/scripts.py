"""A command-line script's `main` run in this process: for the tests of its argument handling,
which need neither a process of their own nor its seconds of importing torch again (each script
keeps at least one test that runs it as a process)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


@dataclass
class Done:
    """What the process would have shown: its exit status, stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str


def load(path: Path) -> ModuleType:
    """The script at `path` as a module named after it (`bench_<stem>`), loaded once: a name of
    its own, so that it never takes the place of a test module or another script's."""
    name = f"bench_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # the scripts import their siblings by name
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_main(main: Callable[[], Any], script: Path, args: list[str]) -> Done:
    """`main()` with `sys.argv` as `python script *args` would set it; an exit status as the
    interpreter gives it (SystemExit's number, 1 and the message on stderr for a string, 0 for
    None or a return of None, else the int `main` returned)."""
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = [str(script), *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main()
            except SystemExit as exit_:
                code = exit_.code
                if isinstance(code, str):
                    print(code, file=sys.stderr)
                    code = 1
    finally:
        sys.argv = argv
    return Done(code if isinstance(code, int) else 0, out.getvalue(), err.getvalue())
