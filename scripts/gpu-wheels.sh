#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what scripts/gpu-check.sh installs on a bare GPU machine that
# reaches no package registry: our two packages built as wheels, and the wheels of the
# dependencies that machine's image lacks, for its Python (3.12, x86-64 Linux): the hook's
# websockets, the server's web stack and database layer (pinned in constraints.txt), and wandb,
# the GPU benchmark's peer (benchmarks/requirements-peers.txt) with what it needs, and the quantized
# optimizers the CUDA tests read (torchao, bitsandbytes). Run it where
# PyPI is reachable: `make gpu-wheels`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PYVER=${GPU_PYTHON_VERSION:-3.12}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
download() { "$PY" -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${PLATFORMS[@]}" "$@" 2> >(grep -v "^WARNING: Location" >&2); }
rm -rf .whl && mkdir -p .whl
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl ./trainer_hook ./backend
pin() { grep -h -i -E "^$1==" constraints.txt benchmarks/requirements-peers.txt | head -1; }
pins=()
for name in websockets fastapi starlette uvicorn httptools sqlalchemy alembic mako pydantic pydantic-core \
            annotated-types typing-inspection typing-extensions; do
    p=$(pin "$name")
    [ -n "$p" ] || { echo "gpu-wheels: $name is not pinned in constraints.txt" >&2; exit 1; }
    pins+=("$p")
done
download --no-deps -d .whl "${pins[@]}"
# wandb and its closure, less what the image has (KINDS.md of the device tool lists it) or what
# we already took at our pins above: one version of each package, or the install stops.
tmp=$(mktemp -d)
download -d "$tmp" "$(pin wandb)"
for f in "$tmp"/*.whl; do
    name=$(basename "$f" | cut -d- -f1 | tr '[:upper:]_' '[:lower:]-')
    case " $name " in
        *" protobuf "*|*" pyyaml "*|*" requests "*|*" urllib3 "*|*" certifi "*|*" charset-normalizer "*|\
        *" idna "*|*" click "*|*" packaging "*|*" h11 "*|*" httpx "*|*" httpcore "*|*" anyio "*|\
        *" sniffio "*|*" xxhash "*|*" pydantic "*|*" pydantic-core "*|*" annotated-types "*|\
        *" typing-inspection "*|*" typing-extensions "*) ;;
        *) cp "$f" .whl/ ;;
    esac
done
rm -rf "$tmp"
# The quantized-state libraries the CUDA tests read (tests/trainer_hook/test_quantized_state.py).
# bitsandbytes ships one library per CUDA and ROCm release (43 MB): only the CUDA 13 ones, which
# the GPU image's torch uses, are kept, so that .whl/ stays under the device tool's 64 MiB carry.
download --no-deps -d .whl "$(pin torchao)" "$(pin bitsandbytes)"
"$PY" - .whl/bitsandbytes-*.whl <<'TRIM'
import re, sys, zipfile
path = sys.argv[1]
drop = re.compile(r"bitsandbytes/libbitsandbytes_(cuda1[0-2]\d|rocm\d+|xpu\d+)\.so$")
with zipfile.ZipFile(path) as src:
    items = [(i, src.read(i)) for i in src.infolist() if not drop.search(i.filename)]
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as dst:
    for info, data in items:
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(line for line in data.splitlines(keepends=True) if not drop.search(line.split(b",")[0].decode()))
        dst.writestr(info, data)
TRIM
du -sh .whl
