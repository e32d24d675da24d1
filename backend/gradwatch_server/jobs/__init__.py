"""Distributed jobs on the server (docs/distributed.md): a job's global step assembled from its
ranks' steps.

- `assemble`: the combination rules, pure functions of a `RankStep` (one rank's step) per rank;
- `memory`: what the assembling process keeps of a job between assemblies (`JobMemory`);
- `commits`: the ranks' frames of every connection stored in group commits (`GroupCommits`);
- `assembler`: `JobAssembler`, which runs the assembly after a rank's batch and on a timer, and
  tells the job's findings;
- `ranks`: what GET /api/runs/{id}/ranks answers.

The SQL a job needs (open a rank's run, assemble into the job's run, prune, partial ranges) is
the store's, as every table's: store/jobs.py and store/ranks.py. Nothing outside this package
imports its modules but the app's wiring (app.py, deps.py, ingest.py), the store (memory) and the
diagnostics (the names of the `rank_desync` evidence). This file imports nothing: the store
imports `memory`, and `assembler` imports the store.
"""
