"""Which rank of which distributed job this process is, and the job's one run id.

Every rank of a `torchrun` (or any `torch.distributed`) job calls `watch()`; the job is one run
on the server, each rank one stream of it (docs/design.md, "How the ranks of a job agree on one
run"). The ranks agree on the run id once, inside `watch()`, and never again:

- with the default process group initialised, rank 0 draws the id and writes it to the group's
  c10d store under `gradwatch/job/{n}`, where n counts this process's distributed `watch()`
  calls (every rank calls `watch()` in the same order); the others wait for that key, at most
  `STORE_TIMEOUT_S` seconds. A store read is a request to the store's server, not a collective:
  no rank's training waits for another's because of it, and no process group sees it. Each rank
  also sets `gradwatch/job/{n}/joined/{rank}`; rank 0, from a thread of its own, checks once
  after `STORE_TIMEOUT_S` that every rank did, and warns of those that did not call `watch()`.
- without one, under torchrun (`WORLD_SIZE` > 1 and a `TORCHELASTIC_RUN_ID`), the id is a hash
  of the launcher's run id and n, which every rank computes alike.
- otherwise, or when the key never comes, this rank warns once and is watched as a run of its own.

A world of one process is no distributed job: `join()` returns None and the run is a plain one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch

log = logging.getLogger("gradwatch")

#: Seconds the other ranks wait for rank 0's job id in the store; rank 0 may reach `watch()`
#: later than they do (it loads a checkpoint, say). Tests set it shorter.
STORE_TIMEOUT_S = 60.0
#: The store key of the n-th distributed `watch()` of a job.
STORE_KEY = "gradwatch/job/{n}"
#: The store key each rank sets in its n-th distributed `watch()`: rank 0 checks, once, in the
#: background, that every rank did (a rank that never calls watch() holds the server's run up).
JOINED_KEY = "gradwatch/job/{n}/joined/{rank}"
#: What a job id is (the run id the user sees; the protocol's, docs/protocol.md).
JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,56}$")


@dataclass(frozen=True)
class Rank:
    """This process's place in a distributed job whose run is `job`."""

    job: str
    rank: int
    world_size: int
    local_rank: Optional[int] = None
    backend: Optional[str] = None
    #: the run's name as rank 0 gave it to `join()` (None where no store carried it)
    name: Optional[str] = None

    @property
    def stream_id(self) -> str:
        """The id of this rank's stream (its hello's `run.id`, its spool file's name)."""
        return f"{self.job}.r{self.rank}"

    def hello(self) -> dict[str, Any]:
        """The hello's `dist` object."""
        return {"job": self.job, "rank": self.rank, "world_size": self.world_size}

    def config(self, params: Iterable[torch.Tensor]) -> dict[str, Any]:
        """The run config's `dist` entry (informational): backend, local rank, and the distinct
        device meshes of `params` that are DTensors."""
        return {"backend": self.backend, "local_rank": self.local_rank, "meshes": meshes(params)}


@dataclass(frozen=True)
class _Place:
    rank: int
    world_size: int
    local_rank: Optional[int]
    backend: Optional[str]
    initialised: bool  # the default process group exists (its store holds the job id)


_lock = threading.Lock()
_calls = 0  # distributed watch() calls so far in this process: the n of the store key
_warned = False


def join(name: Optional[str] = None, env: Mapping[str, str] = os.environ) -> Optional[Rank]:
    """This process's `Rank` in the job it belongs to, with the job's run id agreed with the
    other ranks; None when it is not part of a job of several processes, or when the ranks could
    not agree (warned once): then it is watched as a run of its own. Never raises.

    `name` is this rank's name for the run; rank 0's comes back as `Rank.name` on every rank
    where the store carries it, so that a default (dated) name is the same on every rank."""
    global _calls
    try:
        place = _place(env)
    except Exception as exc:  # a torch.distributed without what we read: no job to join
        log.debug("gradwatch: cannot read the distributed setup: %s", exc)
        return None
    if place is None:
        return None
    with _lock:
        n = _calls
        _calls += 1
    try:
        job, name = _agree(place, n, env, name)
    except Exception as exc:
        job, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "torch.distributed is not initialised and the launcher set no TORCHELASTIC_RUN_ID"
    if job is None:
        _warn_once(place, why)
        return None
    return Rank(job, place.rank, place.world_size, place.local_rank, place.backend, name)


def job_rank(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """This process's rank in a job of several processes (the default process group's once
    initialised, else torchrun's `RANK`), None when it runs alone. Never raises."""
    try:
        place = _place(env)
    except Exception:  # a torch.distributed without what we read: no job
        return None
    return None if place is None else place.rank


def _place(env: Mapping[str, str]) -> Optional[_Place]:
    """Rank, world size, local rank and backend, from the default process group if there is one,
    else from torchrun's environment; None for a single process."""
    local_rank = _int(env.get("LOCAL_RANK"))
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        size = dist.get_world_size()
        return None if size <= 1 else _Place(dist.get_rank(), size, local_rank, str(dist.get_backend()), True)
    rank, world_size = _int(env.get("RANK")), _int(env.get("WORLD_SIZE"))
    if rank is None or world_size is None or world_size <= 1 or not 0 <= rank < world_size:
        return None
    return _Place(rank, world_size, local_rank, None, False)


def _agree(place: _Place, n: int, env: Mapping[str, str], name: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """The job id every rank of the job gets for its n-th distributed watch() (None if none can be
    agreed), and rank 0's run name (None where there is no store to carry it)."""
    if place.initialised:
        store = torch.distributed.distributed_c10d._get_default_store()
        key = STORE_KEY.format(n=n)
        store.set(JOINED_KEY.format(n=n, rank=place.rank), "1")
        if place.rank == 0:
            job = secrets.token_hex(6)
            if name is not None:
                store.set(f"{key}/name", name)  # before the id: a rank that sees the id finds the name
            store.set(key, job)
            _check_joined_later(n, job, place.world_size)
            return job, name
        store.wait([key], timedelta(seconds=STORE_TIMEOUT_S))
        job = bytes(store.get(key)).decode("ascii", "replace")
        if not JOB_ID.match(job):
            raise ValueError(f"the store's {key} holds {job[:80]!r}, not a job id")
        named = store.check([f"{key}/name"])
        return job, bytes(store.get(f"{key}/name")).decode("utf-8", "replace") if named else None
    launch = env.get("TORCHELASTIC_RUN_ID")
    if not launch or launch == "none":
        return None, None
    return hashlib.sha1(f"{launch}/{n}".encode()).hexdigest()[:12], None


def _check_joined_later(n: int, job: str, world_size: int) -> None:
    """In `STORE_TIMEOUT_S` seconds, on a daemon thread (never the training thread's time; one
    store request, no collective), warn once if some rank has not set its `JOINED_KEY` for the
    n-th watch(): the server then waits for a stream that never comes (`watch()` on rank 0 only).
    The store is looked up then, not held: a job that ended or made a new process group meanwhile
    (whose store does not hold this `job` under the key) is left alone."""
    delay = STORE_TIMEOUT_S

    def check() -> None:
        time.sleep(delay)
        try:
            if not torch.distributed.is_initialized():
                return
            store = torch.distributed.distributed_c10d._get_default_store()
            key = STORE_KEY.format(n=n)
            if not store.check([key]) or bytes(store.get(key)).decode("ascii", "replace") != job:
                return
            joined = [JOINED_KEY.format(n=n, rank=r) for r in range(world_size)]
            if store.check(joined):
                return
            missing = [r for r, k in enumerate(joined) if not store.check([k])]
        except Exception as exc:  # the store went away with its job: nothing to say
            log.debug("gradwatch: cannot check which ranks called watch(): %s", exc)
            return
        log.warning(
            "gradwatch: %s of %d did not call watch() within %.0f s; the run %s waits for %s on the "
            "server. Call gradwatch.watch() on every rank (the HF/Lightning callbacks do), the same "
            "number of times.",
            _ranks(missing),
            world_size,
            delay,
            job,
            "it" if len(missing) == 1 else "them",
        )

    threading.Thread(target=check, name="gradwatch-joined", daemon=True).start()


def _ranks(ranks: list[int]) -> str:
    """`rank 1`, `ranks 1, 2 and 3`, `ranks 1, 2, 3, ... (12 in all)`."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 8:
        return "ranks " + ", ".join(map(str, ranks[:8])) + f", ... ({len(ranks)} in all)"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _warn_once(place: _Place, why: str) -> None:
    global _warned
    with _lock:
        if _warned:
            return
        _warned = True
    log.warning(
        "gradwatch: rank %d of %d could not agree on one run with the other ranks (%s); it is watched as "
        "a run of its own. Call watch() on every rank after torch.distributed.init_process_group().",
        place.rank,
        place.world_size,
        why,
    )


def meshes(params: Iterable[torch.Tensor]) -> list[dict[str, Any]]:
    """The distinct device meshes (shape, dimension names) of the DTensors among `params`."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without DTensor: no parameter can be one
        return []
    out: list[dict[str, Any]] = []
    for p in params:
        if isinstance(p, DTensor):
            mesh = p.device_mesh
            names = mesh.mesh_dim_names
            entry = {"shape": list(mesh.shape), "dim_names": None if names is None else list(names)}
            if entry not in out:
                out.append(entry)
    return out


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None
