"""Watch every optimizer a script makes, with no change to the script (`gradwatch-run`).

`gradwatch-run` (launch.py) starts the command with `$GRADWATCH_AUTOWATCH` set and a folder of
this package first on `PYTHONPATH` whose `sitecustomize.py` calls `start_from_env()` in every
Python process the command starts (torchrun's workers included). Nothing is imported here until
the script imports torch: then one global optimizer step pre-hook is registered
(`torch.optim.optimizer.register_optimizer_step_pre_hook`). At the first step of an optimizer
that no `watch()` watches yet, it watches, from that step on, every live torch optimizer not
watched yet as one set, as `watch([...])` would (one run; under torchrun one run per job, as
each rank calls `watch()`), named after the module that owns their parameters. Afterwards the
hook costs one weak-set lookup per step.

A script that calls `watch()` itself is not watched twice: an optimizer that `watch()` took
before its first step is left to it; one it takes later closes the launcher's run of it.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from .options import WatchOptions

if TYPE_CHECKING:  # torch is imported only once the script imports it
    import torch

    from .watcher import Watcher

log = logging.getLogger("gradwatch")

#: The launcher's settings for the processes it starts: a JSON object with `project`, `run`, `every`.
ENV = "GRADWATCH_AUTOWATCH"

#: optimizers already decided: watched (by the launcher or by the script), or wrapped by one watched
_decided: weakref.WeakSet[Any] = weakref.WeakSet()
#: optimizer -> the launcher's Watcher that watches it
_auto: weakref.WeakKeyDictionary[Any, Watcher] = weakref.WeakKeyDictionary()
#: the launcher's options (warn=False: the script's own output stays as it is; findings are on the dashboard)
_options = WatchOptions(warn=False)
_sets = 0  # optimizer sets this process watched: the second one's run is NAME-2


def settings_from_env(value: Optional[str]) -> WatchOptions:
    """`$GRADWATCH_AUTOWATCH` read: {"project", "run", "every"} as the options of this process's
    watching; ValueError (or TypeError, a bad value) if it is not the launcher's."""
    try:
        loaded = json.loads(value or "")
    except json.JSONDecodeError as exc:
        raise ValueError(f"${ENV} is not JSON: {exc}") from exc
    if not isinstance(loaded, dict) or set(loaded) - {"project", "run", "every"}:
        raise ValueError(f'${ENV} must be a JSON object with "project", "run", "every"; got {value!r:.200}')
    return WatchOptions(**loaded, warn=False)


def start_from_env() -> None:
    """In a process the launcher started: watch optimizers once torch is imported (see the module docstring)."""
    global _options
    if ENV not in os.environ:
        return
    _options = settings_from_env(os.environ[ENV])
    if "torch" in sys.modules:
        _install()
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `torch` is first imported, it lets the other finders find it and
    registers the global hook once torch's module has run (torch.optim is loaded by then)."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: the search below must not come back here
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def run_then_install(module: Any) -> None:
            exec_module(module)
            _install()

        loader.exec_module = run_then_install
        return spec


def _install() -> None:
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(_first_step)
    except Exception as exc:  # an old torch: say so, and let the script run
        log.error("gradwatch-run: cannot hook this torch's optimizers (%s); the script runs unwatched", exc)


def claim(optimizers: Sequence[Any]) -> None:
    """`watch()` took `optimizers`: the launcher leaves them to it, and closes its own run of any
    of them (the script's watch() came after their first step)."""
    for opt in optimizers:
        _decided.add(opt)
        mine = _auto.pop(opt, None)
        if mine is not None:
            log.info(
                "gradwatch-run: the script watches %s itself: the launcher's run %s ends",
                type(opt).__name__,
                mine.run_id,
            )
            mine.close()


def _first_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """The global pre-hook: every optimizer's every step; only an undecided optimizer's first step works."""
    if optimizer in _decided:
        return None
    try:
        watch_new(optimizer)
    except Exception as exc:  # never into the training loop
        _decided.add(optimizer)
        log.error(
            "gradwatch-run: could not watch %s; the training goes on unwatched", type(optimizer).__name__, exc_info=exc
        )
    return None


def watch_new(optimizer: torch.optim.Optimizer) -> Optional[Watcher]:
    """Watch `optimizer` and every other live optimizer nobody watches yet, as one set, from this
    step on; None if there is nothing to watch (`optimizer` is wrapped by another one)."""
    global _sets
    import torch

    from .watcher import Watcher

    objects = gc.get_objects()
    found = [o for o in objects if _is(o, torch.optim.Optimizer) and "_optimizer_step_pre_hooks" in vars(o)]
    if not any(o is optimizer for o in found):
        found.append(optimizer)
    fresh = [o for o in found if o not in _decided]
    # an optimizer kept in another one's attributes (ZeroRedundancyOptimizer.optim) steps inside it
    inner = {id(v) for o in found for v in vars(o).values() if _is(v, torch.optim.Optimizer)}
    chosen = [o for o in fresh if id(o) not in inner and any(g["params"] for g in o.param_groups)]
    for o in fresh:
        _decided.add(o)
    if not chosen:
        return None
    # the step in flight first: it is the round's first optimizer, as in the script
    chosen.sort(key=lambda o: o is not optimizer)
    modules = [o for o in objects if _is(o, torch.nn.Module)]
    del objects
    model = owner(chosen, modules)
    _sets += 1
    options = _options
    if options.run is not None and _sets > 1:
        options = dataclasses.replace(options, run=f"{options.run}-{_sets}")
    w = Watcher(chosen, options, model=model)
    for o in chosen:
        _auto[o] = w
    if w.dist is not None:
        _close_before_destroy()
    return w


def _close_before_destroy() -> None:
    """Close the launcher's runs when the script destroys its default process group, as a script
    that watches itself closes before it: a gloo group destroyed while a run is open waits forever
    at exit. `torch.distributed.destroy_process_group` is wrapped once, for this process."""
    import torch.distributed as dist

    original = dist.destroy_process_group
    if getattr(original, "_gradwatch", False):
        return

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("group") is None:  # the default group: the job ends
            for w in set(_auto.values()):
                w.close()
        return original(*args, **kwargs)

    destroy_process_group._gradwatch = True  # type: ignore[attr-defined]
    dist.destroy_process_group = destroy_process_group


def _is(obj: object, cls: type) -> bool:
    """isinstance without asking the object (a lazy proxy's __class__ may raise)."""
    return issubclass(type(obj), cls)


def owner(
    optimizers: Sequence[torch.optim.Optimizer], modules: Sequence[torch.nn.Module]
) -> Union[torch.nn.Module, list[tuple[str, torch.Tensor]], None]:
    """What names the optimizers' parameters as the script knows them: the outermost module (one
    no other module holds) that holds them all (its wrappers' path components are left out, as
    for `watch(model=...)`); where no single one does, the (name, parameter) pairs of the modules
    holding them, most first, each name prefixed by its module's class name; None if none does."""
    wanted: dict[int, int] = {}  # id -> place in the optimizers' order
    for opt in optimizers:
        for g in opt.param_groups:
            for p in g["params"]:
                wanted.setdefault(id(p), len(wanted))
    held = {id(c) for m in modules for c in m.children()}
    roots = []
    for m in modules:
        if id(m) in held:
            continue
        places = [wanted[i] for i in {id(p) for p in m.parameters()} if i in wanted]
        if places:  # most parameters held, then the fewest others, then the optimizers' order
            roots.append((-len(places), sum(1 for _ in m.parameters()) - len(places), min(places), m))
    if not roots:
        return None
    roots.sort(key=lambda r: r[:3])
    if -roots[0][0] == len(wanted):
        return roots[0][3]
    from .pieces import strip_names, wrapper_paths

    pairs: list[tuple[str, torch.Tensor]] = []
    named: set[int] = set()
    classes: dict[str, int] = {}
    for *_, m in roots:
        if len(named) == len(wanted):
            break
        params = list(m.named_parameters())
        cls = type(m).__name__
        classes[cls] = classes.get(cls, 0) + 1
        prefix = cls if classes[cls] == 1 else f"{cls}{classes[cls]}"
        for n, (_, p) in zip(strip_names([n for n, _ in params], wrapper_paths(m)), params):
            if id(p) in wanted and id(p) not in named:
                named.add(id(p))
                pairs.append((f"{prefix}.{n}", p))
    return pairs
