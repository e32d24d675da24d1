"""Jobs' parameter lists by digest (protocol v2's `params_digest`, docs/protocol.md).

A rank's v2 hello may name its job's parameter list and groups by digest instead of sending them
(108 KB for 700 tensors, each one validated). The store knows a list by its digest once a hello
sent it in full, or once it has computed the digest of a job's stored list (after a restart, or
a job another worker opened): `resolve` gives the list a digest names, and `job_digest` the
digest of a job's stored list, so a rank's hello whose digest is its job's needs no comparison
of the lists row by row.
"""

from __future__ import annotations

import collections
import threading

from sqlalchemy import Connection, select

from ..protocol import GroupInfo, ParamInfo, params_digest
from ..schema import runs
from .runs import get_groups, get_params

#: Lists kept by digest (a server takes few jobs at a time; each list is one job's).
MAX_LISTS = 64

ParamList = tuple[list[ParamInfo], list[GroupInfo]]


class ParamLists:
    """Parameter lists by digest, and jobs' digests; safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists: collections.OrderedDict[str, ParamList] = collections.OrderedDict()
        #: (job, its run's created_at) -> the digest of its stored list: a job deleted and
        #: created again is another key
        self._jobs: dict[tuple[str, float], str] = {}

    def remember(self, digest: str, params: list[ParamInfo], groups: list[GroupInfo]) -> None:
        with self._lock:
            self._lists[digest] = (params, groups)
            self._lists.move_to_end(digest)
            while len(self._lists) > MAX_LISTS:
                self._lists.popitem(last=False)

    def remember_job(self, params: list[ParamInfo], groups: list[GroupInfo]) -> None:
        """Remember the list of a hello that created its job, without that rank's pieces."""
        job_wide = [
            ParamInfo.model_construct(
                name=p.name, shape=p.shape, numel=p.numel, dtype=p.dtype, group=p.group, optimizer=p.optimizer
            )
            for p in params
        ]
        self.remember(params_digest(job_wide, groups), job_wide, list(groups))

    def known(self, digest: str) -> ParamList | None:
        with self._lock:
            return self._lists.get(digest)

    def resolve(self, conn: Connection, job: str, digest: str) -> tuple[ParamList | None, bool]:
        """The list `digest` names (known already, or `job`'s stored list if that is its digest),
        and whether `job` has a stored list (its run exists)."""
        found = self.known(digest)
        row = conn.execute(select(runs.c.created_at, runs.c.kind).where(runs.c.id == job)).one_or_none()
        if found is not None or row is None or row.kind != "job":
            return found, row is not None
        if self.job_digest(conn, job, row.created_at) != digest:
            return None, True
        return self.known(digest), True

    def job_digest(self, conn: Connection, job: str, created_at: float) -> str:
        """The digest of `job`'s stored parameter list and groups (computed once per job)."""
        with self._lock:
            digest = self._jobs.get((job, created_at))
        if digest is not None:
            return digest
        params = [
            ParamInfo.model_construct(
                name=p.name, shape=p.shape, numel=p.numel, dtype=p.dtype, group=p.group, optimizer=p.optimizer
            )
            for p in get_params(conn, job)
        ]
        groups = [
            GroupInfo.model_construct(optimizer=g.optimizer, index=g.index, name=g.name, hparams=g.hparams)
            for g in get_groups(conn, job)
        ]
        digest = params_digest(params, groups)
        self.remember(digest, params, groups)
        with self._lock:
            self._jobs[(job, created_at)] = digest
        return digest
