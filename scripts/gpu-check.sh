#!/usr/bin/env bash
# The CUDA path on a GPU machine, in one run: every test marked `cuda`, then the GPU benchmark.
# Made for a bare machine that reaches no registry and has its own torch: it installs our two
# packages and the missing dependencies from .whl/ (filled beforehand by `make gpu-wheels` where
# PyPI is reachable) into a folder of its own, without touching the machine's torch. Writes the
# test summary (cuda-tests.txt, cuda-tests.xml), the benchmark's table (gpu-bench.md) and its
# torch.profiler tables (gpu-profile-MODEL.txt) to $OUT
# (default ./gpu-out). Without a GPU the tests skip and the benchmark says why it cannot run.
#
#     scripts/gpu-check.sh [--quick]     # --quick: 5 benchmark rounds, for a dry run
#     GPU_ROUNDS=12 GPU_VARIANTS='aa,gradwatch every=1' scripts/gpu-check.sh   # fewer rounds, no peer
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ROUNDS=${GPU_ROUNDS:-20}
[ "${1:-}" = "--quick" ] && ROUNDS=5
VARIANTS=${GPU_VARIANTS:-aa,gradwatch every=1,gradwatch auto,gradwatch unmeasured,wandb.watch}

export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

WHEELS=${GPU_WHEELS:-.whl}  # GPU_WHEELS=none: a dry run with this Python's own packages
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    site=$(mktemp -d /tmp/gradwatch-site.XXXX)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl \
        || { echo "gpu-check: installing $WHEELS/ failed" >&2; exit 1; }
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "gpu-check: no .whl/ (make gpu-wheels): using the packages this Python already has"
fi
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
    "$PY" -c 'import sys, torch, gradwatch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "gradwatch", gradwatch.__file__)'
} | tee "$OUT/env.txt"

status=0
"$PY" -m pytest -p no:cacheprovider -m cuda -rA -q --timeout 300 --junitxml "$OUT/cuda-tests.xml" \
    tests/trainer_hook/test_cuda.py tests/trainer_hook/test_quantized_state.py 2>&1 | tee "$OUT/cuda-tests.txt"
tests=${PIPESTATUS[0]}
[ "$tests" -eq 0 ] || status=$tests

"$PY" benchmarks/gpu.py --rounds "$ROUNDS" --out "$OUT/gpu-bench.md" --profile "$OUT/gpu-profile.txt" \
    --variants "$VARIANTS" 2>&1 | tee "$OUT/gpu-bench.log"
bench=${PIPESTATUS[0]}
if [ "$bench" -eq 3 ]; then
    echo "gpu-check: the benchmark did not run (no CUDA device)"
elif [ "$bench" -ne 0 ]; then
    status=$bench
fi
echo "gpu-check: tests exit $tests, benchmark exit $bench"
exit "$status"
