"""Helpers shared by the tests and the benchmarks (not tests themselves; pytest collects none here).

- `server`: a real `gradwatch serve` process on a free port (`start_server`, `ServerProcess`).
- `pg`: a throwaway PostgreSQL cluster, and a fresh database per test.
- `databases`: an empty database of either kind the server supports (`new_database`).
- `wiremsg`: hand-built protocol v1 messages and a small websocket hook (independent of the hook).
- `synthetic`: a plausible training run as protocol v1 messages, for the dashboard.
- `wiresteps`, `sent`: the `step` messages that a hook's `steps` message stands for, decoded.
- `probing`: one step of a measuring `Probe` without a watcher, as the watcher drives it.
- `jsonfloats`, `heatcells`: the API's JSON numbers and heatmap cells read back bit for bit.
"""
