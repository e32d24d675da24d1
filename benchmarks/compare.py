"""Two commits side by side: the storage paths and the hook's every=1, interleaved on one machine.

    python benchmarks/compare.py BASE [HEAD]          # make bench-compare BASE=48517db [HEAD=...]

Each commit gets a throwaway tree of its own (`git archive` of its `trainer_hook/` and
`backend/`: unlike `git worktree add` it leaves nothing in the repository's .git when killed)
and a virtual environment of its own whose only packages are that tree's (a .pth file), over
this interpreter's site-packages for torch and the pinned dependencies: a build takes a second,
not the minutes of a torch install. HEAD left out is the working tree as it is, uncommitted
changes included. Both run on this tree's pinned dependencies: what is compared is our code.

Both commits then run the same workload, `benchmarks/compare_workload.py` from this tree, each
with its own interpreter, through their public interfaces only (`gradwatch sync`, `gradwatch
export`, the HTTP endpoints, `gradwatch.watch()`), so old commits are measured by today's script:
  storage  a run of --params tensors x --steps steps, written once in the hook's spool format
           (AdamW's six metrics and grad_status, 8 scalars, --batch steps a message as a
           spooling hook writes them), replayed into a fresh SQLite server with `gradwatch sync`;
           then `gradwatch export --format csv` of it; then one parameter's series, the loss and
           the heatmap over HTTP.
  hook     every=1 on the overhead benchmark's MLP (80 tensors) and GPT-style model (76 tensors,
           13.8M parameters), each step paired with its unwatched twin (see compare_workload.py).

A round runs every part once for each commit, alternating which goes first (BASE, HEAD, then
HEAD, BASE: a drift of the machine's speed falls on both alike). Each figure is printed for both
(the median over rounds), with HEAD/BASE: the median of the rounds' ratios and, in brackets,
their smallest and largest, the spread to read it against. For the hook the ratio is of the
watched steps relative to their twins, (1 + HEAD's overhead) / (1 + BASE's overhead).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKLOAD = HERE / "compare_workload.py"
sys.path.insert(0, str(HERE))
from storage import SCALARS, grad_norms, param_names, status_codes  # noqa: E402  (the storage benchmark's data)

PARTS = ("storage", "hook")
MODELS = ("mlp", "gpt")
#: Figures where more is better (the others are times).
HIGHER_IS_BETTER = ("rows/s",)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


# -- builds ------------------------------------------------------------------------------------


@dataclass
class Build:
    label: str  # what the table calls it: a short commit id, or "working tree"
    source: Path  # the tree whose trainer_hook/ and backend/ it runs
    python: Path


def resolve(rev: str) -> str:
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"compare.py: error: {rev!r} is not a commit of {REPO}") from None


def build(rev: str | None, folder: Path, name: str) -> Build:
    """A venv whose gradwatch and gradwatch_server are those of `rev` (None: the working tree)."""
    if rev is None:
        source, label = REPO, "working tree"
    else:
        commit = resolve(rev)
        source, label = folder / f"{name}-tree", commit[:7]
        source.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, "trainer_hook", "backend"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    venv = folder / f"{name}-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # Its own code first; then this interpreter's packages (torch, the pinned dependencies),
    # whose copies of gradwatch and gradwatch_server come later on sys.path and are never imported.
    base = sysconfig.get_paths()["purelib"]
    (site / "gradwatch_compare.pth").write_text(
        f"{source / 'trainer_hook'}\n{source / 'backend'}\nimport site; site.addsitedir({base!r})\n"
    )
    where = subprocess.run(
        [str(python), "-c", "import gradwatch, gradwatch_server; print(gradwatch.__file__, gradwatch_server.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        env=clean_env(),
    ).stdout.split()
    if not all(Path(p).is_relative_to(source) for p in where):
        raise RuntimeError(f"{label}: its venv imports {where}, not the code of {source}")
    log(f"built {label}: {python}")
    return Build(label, source, python)


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH (it would run this checkout's code) or gradwatch's settings."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("GRADWATCH_")}
    env["OMP_NUM_THREADS"] = "1"  # one thread a model: on a shared 2-core machine two thrash
    return env


# -- the spooled run ---------------------------------------------------------------------------


def spool_record(message: dict[str, object]) -> bytes:
    """One record of the hook's spool file: b"GWS1", length, CRC-32 (uint32 LE), UTF-8 JSON."""
    data = json.dumps(message, allow_nan=False, separators=(",", ":")).encode()
    return struct.pack("<4sII", b"GWS1", len(data), zlib.crc32(data)) + data


def b64(values: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(values).tobytes()).decode("ascii")


def write_spool(path: Path, run_id: str, params: int, steps: int, batch: int) -> str:
    """A spooled run in protocol version 1, as a hook whose server was away leaves it: its hello,
    then `steps` messages of `batch` steps. Returns the name of the parameter the reads ask for."""
    rng = np.random.default_rng(7)
    names = param_names(params)
    hello = {
        "v": 1,
        "type": "hello",
        "run": {
            "id": run_id,
            "name": f"compare {run_id}",
            "project": "compare",
            "started_at": time.time(),
            "hook_version": "compare",
            "optimizer": "AdamW",
            "config": {"every": 1},
        },
        "params": [
            {"name": n, "shape": [64, 64], "numel": 4096, "dtype": "float32", "group": 0, "optimizer": 0} for n in names
        ],
        "groups": [{"optimizer": 0, "index": 0, "name": None, "hparams": {"lr": 3e-4}}],
    }
    grad = grad_norms(rng, steps, params)
    weight = rng.lognormal(1.0, 0.5, params).astype(np.float32)
    with open(path, "wb") as f:
        f.write(spool_record(hello))
        for seq, lo in enumerate(range(0, steps, batch), start=1):
            g = grad[lo : lo + batch]
            n = len(g)
            index = np.arange(lo, lo + n, dtype=np.float32)[:, None]
            metrics = {
                "grad_norm": g,
                "param_norm": weight * (1 + np.float32(1e-4) * index),
                "exp_avg_norm": g * rng.uniform(0.5, 1.5, g.shape).astype(np.float32),
                "exp_avg_sq_norm": g * g * rng.uniform(0.5, 1.5, g.shape).astype(np.float32),
                "backward_passes": np.ones(g.shape, np.float32),
                "grad_clear": np.ones(g.shape, np.float32),
            }
            scalars = {k: [1.0] * n for k in SCALARS}
            scalars["loss"] = [5.0 / (1 + lo + i) for i in range(n)]
            message = {
                "v": 1,
                "type": "steps",
                "seq": seq,
                "step": list(range(lo + 1, lo + n + 1)),
                "time": [1.7e9 + lo + i for i in range(n)],
                "scalars": scalars,
                "params": {k: b64(v.astype("<f4")) for k, v in metrics.items()},
                "grad_status": b64(status_codes(g)),
            }
            f.write(spool_record(message))
    return names[min(3, params - 1)]


# -- rounds ------------------------------------------------------------------------------------


@dataclass
class Figures:
    """name -> one value per round, for one build."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, result: dict[str, float]) -> None:
        for name, value in result.items():
            self.values.setdefault(name, []).append(value)


def workload(b: Build, args: list[str], folder: Path) -> dict[str, float]:
    folder.mkdir(parents=True)
    env = clean_env()
    env["GRADWATCH_SPOOL"] = str(folder / "hook-spool")  # a watch() that spools leaves nothing in ~
    done = subprocess.run(
        [str(b.python), str(WORKLOAD), *args, "--folder", str(folder)], capture_output=True, text=True, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"{b.label}: compare_workload.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def ratio_cells(name: str, base: list[float], head: list[float]) -> tuple[float, float, float] | None:
    """HEAD/BASE per round: (median, smallest, largest); None where a BASE round measured 0, as a
    CPU time below its clock's tick does, so that no ratio is defined. Overheads compare their
    watched steps."""
    if name.endswith("overhead %"):
        ratios = [(1 + h / 100) / (1 + b / 100) for b, h in zip(base, head, strict=True)]
    elif any(b == 0 for b in base):
        return None
    else:
        ratios = [h / b for b, h in zip(base, head, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def number(value: float) -> str:
    """1,234,567 or 12.35: whole numbers from a thousand up, four significant digits below."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def table(base: Build, head: Build, figures: dict[str, Figures]) -> str:
    lines = [
        f"| figure | {base.label} (BASE) | {head.label} (HEAD) | HEAD/BASE, median (smallest-largest) over rounds |",
        "|---|---|---|---|",
    ]
    for name in figures[base.label].values:
        b, h = figures[base.label].values[name], figures[head.label].values[name]
        cells = ratio_cells(name, b, h)
        ratio = "n/a (a BASE round measured 0)" if cells is None else "{:.3f} ({:.3f}-{:.3f})".format(*cells)
        better = "higher is better" if name.endswith(HIGHER_IS_BETTER) else "lower is better"
        lines.append(
            f"| {name} ({better}) | {number(statistics.median(b))} | {number(statistics.median(h))} | {ratio} |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", metavar="BASE", help="the commit to compare against (a hash, tag, branch)")
    parser.add_argument("head", metavar="HEAD", nargs="?", help="the commit measured (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every part for both (default 3)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"some of: {','.join(PARTS)} (default both)")
    parser.add_argument("--params", type=int, default=1000, help="tensors of the spooled run (default 1000)")
    parser.add_argument("--steps", type=int, default=2000, help="steps of the spooled run (default 2000)")
    parser.add_argument("--batch", type=int, default=50, help="steps per spooled message (default 50)")
    parser.add_argument("--reads", type=int, default=5, help="timed HTTP reads per figure (default 5)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"some of: {','.join(MODELS)} (default both)")
    parser.add_argument("--mlp-cycles", type=int, default=60, help="paired cycles on the MLP (default 60)")
    parser.add_argument("--gpt-cycles", type=int, default=12, help="paired cycles on the GPT (default 12)")
    args = parser.parse_args(argv)
    parts, models = args.parts.split(","), args.models.split(",")
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if not parts or not set(parts) <= set(PARTS):
        parser.error(f"--parts must name some of: {','.join(PARTS)}")
    if not models or not set(models) <= set(MODELS):
        parser.error(f"--models must name some of: {','.join(MODELS)}")
    if min(args.params, args.steps, args.batch, args.reads, args.mlp_cycles, args.gpt_cycles) < 1:
        parser.error("--params, --steps, --batch, --reads and the cycles must be 1 or more")
    args.parts, args.models = parts, models
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    resolve(args.base)  # a bad name fails before anything is built
    if args.head is not None:
        resolve(args.head)
    with tempfile.TemporaryDirectory(prefix="gradwatch-compare-") as tmp_name:
        tmp = Path(tmp_name)
        builds = [build(args.base, tmp, "base"), build(args.head, tmp, "head")]
        base, head = builds
        if base.label == head.label:
            base.label += " (BASE)"
        spool = tmp / "compare.spool"
        run_id = "compare-run"
        param = write_spool(spool, run_id, args.params, args.steps, args.batch)
        jobs: list[list[str]] = []
        if "storage" in args.parts:
            jobs.append(
                ["storage", "--spool", str(spool), "--run", run_id, "--param", param, "--reads", str(args.reads)]
                + ["--steps", str(args.steps), "--params", str(args.params)]
            )
        for model in args.models if "hook" in args.parts else []:
            cycles = args.mlp_cycles if model == "mlp" else args.gpt_cycles
            jobs.append(["hook", "--model", model, "--cycles", str(cycles)])
        figures = {b.label: Figures() for b in builds}
        load = [os.getloadavg()[0]]
        for r in range(args.rounds):
            for i, job in enumerate(jobs):
                order = builds if (r + i) % 2 == 0 else builds[::-1]
                for b in order:
                    t0 = time.perf_counter()
                    folder = tmp / f"round{r}-{job[0]}{i}-{'head' if b is head else 'base'}"
                    result = workload(b, job, folder)
                    figures[b.label].add(result)
                    shown = ", ".join(f"{k} {number(v)}" for k, v in result.items())
                    log(f"round {r + 1}, {b.label}: {shown} ({time.perf_counter() - t0:.0f} s)")
                    shutil.rmtree(folder, ignore_errors=True)
            load.append(os.getloadavg()[0])
        print(
            f"\nBASE {base.label}, HEAD {head.label}; {args.rounds} round(s); storage: {args.params} tensors x "
            f"{args.steps} steps, {args.batch} a message, SQLite; load average {min(load):.1f}-{max(load):.1f}\n"
        )
        print(table(base, head, figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
