"""A fork server for the diagnostics corpus: one interpreter imports torch and the hook once, then
forks a child per script, which runs it as `python script.py` would, a process of its own.

Importing torch is most of a small corpus script's time (about 2 s of its 3 to 4 on a 2-core
machine); a forked child starts with those modules loaded instead. The parent imports only: it
runs no tensor op and starts no thread (torch's thread pools start at the first op, in the child),
so the child is the state of a fresh interpreter right after its imports. The child then takes its
request's environment, folder, argv and `sys.path[0]`, reseeds `random` (a fresh interpreter seeds
it from the OS), writes its output to the request's files and runs the script as `__main__`; it
ends like a script does (atexit hooks, non-daemon threads joined, the exit status of `sys.exit`
or 1 with the traceback of an uncaught exception).

Protocol, one JSON object a line: the client writes {"id", "script", "env", "cwd", "stdout",
"stderr"} to stdin and reads {"id", "pid"} once forked, then {"id", "returncode"} when the child
ended (negative: killed by that signal, as subprocess reports it). At EOF on stdin the server
kills the children still running and exits. Client: `support.corpus.Prefork`.

Its arguments name more modules to import once the same way (test_hf_trainer.py: `transformers`,
3 s of a script's 4 s of imports); a request's "args" (optional) are the script's arguments.

Standalone (run as a file, `support` is not importable here); Linux only (os.pidfd_open).
"""

from __future__ import annotations

import importlib
import json
import os
import random
import runpy
import selectors
import signal
import sys
from typing import Any

import torch  # noqa: F401  (the point: imported once, here)
import torch._dynamo  # noqa: F401  (a script's first optimizer imports it; modules only, no threads)
import torch.distributed  # noqa: F401
import torch.multiprocessing  # noqa: F401
import torch.nn.parallel  # noqa: F401

import gradwatch.watcher  # noqa: F401  (`gradwatch.watch` imports it lazily: loaded here once)


def serve() -> dict[str, Any]:
    """Fork a child per request; in the child, return its request (the parent never returns)."""
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    children: dict[int, tuple[int, str]] = {}  # pidfd -> (pid, request id)
    pending = b""

    def reply(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    while True:
        for key, _ in selector.select():
            if key.fd != sys.stdin.fileno():  # a child ended
                pid, request_id = children.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                reply({"id": request_id, "returncode": os.waitstatus_to_exitcode(status)})
                continue
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:  # the client is gone: so are its scripts
                for pidfd, (pid, _) in children.items():
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    os.close(pidfd)
                sys.exit(0)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    for pidfd in children:
                        os.close(pidfd)
                    selector.close()
                    return dict(request)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, request["id"])
                selector.register(pidfd, selectors.EVENT_READ)
                reply({"id": request["id"], "pid": pid})


def become(request: dict[str, Any]) -> None:
    """In the child: take the request's environment, folder, streams and argv."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    random.seed()
    script = request["script"]
    sys.argv = [script, *request.get("args", [])]
    sys.path[0] = os.path.dirname(script)


if __name__ == "__main__":
    for module in sys.argv[1:]:
        importlib.import_module(module)
    child = serve()
    become(child)
    del child
    # As `python script.py`: an uncaught exception prints its traceback and exits with 1.
    runpy.run_path(sys.argv[0], run_name="__main__")
