"""What a user needs to reproduce a run, gathered once at `watch()` (the hello's `config.context`).

The optimizers and their param groups, the parameter counts, the model's class, the versions of
torch, Python and gradwatch, the host, the devices, the command line (the values of credential
flags such as `--hub_token` redacted) and working directory, and the git commit (and whether the tree was dirty) when the script runs in a git checkout. Nothing
here may fail `watch()`: each fact that cannot be read is left out (git runs with a short timeout).
The user's own `config=` mapping is checked by `user_config` and recorded beside it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from . import __version__
from .layout import Layout, hparams

log = logging.getLogger("gradwatch")

#: Long flags whose value is a credential (`--hub_token hf_...`, `--api-key=...`): the run's
#: context is readable by anyone who can read the server, so their values are never recorded.
SECRET_FLAG = re.compile(r"^--[^=]*(token|key|secret|password|passwd|credential)[^=]*$", re.IGNORECASE)
REDACTED = "***"

#: Seconds each git command may take: a slow network file system must not hold up `watch()`.
GIT_TIMEOUT_S = 2.0
#: Largest user `config=` once serialized: it travels in the hello, which the server keeps whole.
MAX_CONFIG_BYTES = 1 << 20


class ConfigError(TypeError, ValueError):
    """A `config=` holding what JSON cannot carry: a TypeError (a value of the wrong type) that
    `except ValueError` catches too."""


def user_config(config: Any) -> dict[str, Any] | None:
    """The user's `config=` as a plain dict (a copy), or None. TypeError unless it is a mapping;
    ConfigError (a TypeError and a ValueError) unless JSON can hold it exactly (string keys; no
    NaN or infinities, no objects); ValueError past 1 MiB."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise TypeError(
            f"config must be a mapping of names to JSON values (e.g. config={{'lr': 3e-4}}), "
            f"not {type(config).__name__}"
        )
    try:
        text = json.dumps(dict(config), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"config must hold only JSON values (numbers, strings, booleans, None, lists and dicts "
            f"of them, keyed by strings; no NaN or infinity): {exc}"
        ) from None
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"config is {len(text.encode())} bytes as JSON; at most {MAX_CONFIG_BYTES} (record the settings, not data)"
        )
    plain: dict[str, Any] = json.loads(text)  # a copy: later changes by the script are not recorded
    return plain


def run_context(layout: Layout, model: Any) -> dict[str, Any]:
    """The run's context as JSON values (see the module docstring); never raises."""
    out: dict[str, Any] = {}
    for key, read in (
        ("optimizers", lambda: _optimizers(layout)),
        ("parameters", lambda: _parameters(layout, model)),
        ("model", lambda: _class_name(model) if isinstance(model, torch.nn.Module) else None),
        ("versions", _versions),
        ("host", socket.gethostname),
        ("platform", platform.platform),
        ("devices", lambda: _devices(layout)),
        ("argv", lambda: redact_argv(sys.argv)),
        ("cwd", os.getcwd),
        ("git", lambda: git_state(_script_dir())),
    ):
        try:
            out[key] = read()
        except Exception as exc:  # noqa: BLE001  (one missing fact must not cost the others, nor watch())
            log.debug("gradwatch: run context: no %s (%s)", key, exc)
    return out


def redact_argv(argv: Sequence[Any]) -> list[str]:
    """The command line with the value of each SECRET_FLAG replaced by REDACTED, in both the
    `--flag value` and the `--flag=value` form (a following argument that is itself a `--flag`
    is no value and stays)."""
    out = [str(a) for a in argv]
    for i, arg in enumerate(out):
        name, eq, _ = arg.partition("=")
        if not SECRET_FLAG.match(name):
            continue
        if eq:
            out[i] = f"{name}={REDACTED}"
        elif i + 1 < len(out) and not out[i + 1].startswith("--"):
            out[i + 1] = REDACTED
    return out


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ in ("builtins", "__main__") else f"{cls.__module__}.{cls.__qualname__}"


def _optimizers(layout: Layout) -> list[dict[str, Any]]:
    """Each optimizer's class and its param groups: name, hyperparameters, parameter count."""
    out = []
    for opt in layout.optimizers:
        groups = [
            {
                "name": g.get("name") if isinstance(g.get("name"), str) else None,
                "hparams": hparams(g),
                "params": len(g["params"]),
                "numel": sum(p.numel() for p in g["params"]),
            }
            for g in opt.param_groups
        ]
        out.append({"class": _class_name(opt), "groups": groups})
    return out


def _parameters(layout: Layout, model: Any) -> dict[str, int]:
    """Tensors and elements the optimizers update; the model's totals when it is given."""
    counts = {"tensors": len(layout.params), "numel": sum(w.shard.numel for w in layout.params)}
    if isinstance(model, torch.nn.Module):
        params = list(model.parameters())
        counts["model_numel"] = sum(p.numel() for p in params)
        counts["model_trainable_numel"] = sum(p.numel() for p in params if p.requires_grad)
    return counts


def _versions() -> dict[str, str | None]:
    return {
        "gradwatch": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
    }


def _devices(layout: Layout) -> list[str]:
    """The devices holding the watched parameters, a CUDA device with its name (`cuda:0 NVIDIA H100`).
    Reading a device's name queries the driver, never the device's stream: no synchronisation."""
    names = []
    for device in sorted({w.param.device for w in layout.params}, key=str):
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            names.append(f"cuda:{index} {torch.cuda.get_device_name(index)}")
        else:
            names.append(str(device))
    return names


def _script_dir() -> Path:
    """Where the training script lives (its git checkout), else the working directory."""
    script = sys.argv[0] if sys.argv else ""
    if script and script not in ("-c", "-m") and Path(script).is_file():
        return Path(script).resolve().parent
    return Path.cwd()


def git_state(directory: Path, timeout: float = GIT_TIMEOUT_S) -> dict[str, Any] | None:
    """`{"commit": sha, "dirty": bool}` of the git checkout holding `directory`, None outside one
    (or without git, or past `timeout`). Dirty: tracked files differ from the commit."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args],
                cwd=directory,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.debug("gradwatch: git %s: %s", args[0], exc)
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def context_config(layout: Layout, model: Any, config: dict[str, Any] | None) -> dict[str, Any]:
    """The keys `watch()` adds to the hello's run config: `context`, and `user` when given."""
    out: dict[str, Any] = {"context": run_context(layout, model)}
    if config is not None:
        out["user"] = config
    return out


__all__: Sequence[str] = ["context_config", "git_state", "run_context", "user_config"]
