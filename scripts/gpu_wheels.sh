#!/usr/bin/env bash
# Build .whl/: what an offline CUDA machine whose python3 already has torch, transformers and the usual
# scientific stack (this project's lent H100/H200 image: Python 3.12) lacks to run scripts/gpu_check.sh.
# Ray travels as an unpacked install with its Java jars, dashboard front end and library sub-packages
# (data, train, tune, serve, rllib, llm) removed, xz-compressed (~28 MB); the rest as wheels (~10 MB).
# Usage: bash scripts/gpu_wheels.sh [PYTHON_VERSION]   (default 3.12), then carry .whl to the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
TAG=cp${PYV/./}
OUT=${RLINF_WHEEL_DIR:-.whl}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >>.git/info/exclude
mkdir -p "$OUT"

locked() {  # locked NAME: the version uv.lock pins for NAME (the first entry)
    awk -v n="$1" '$0 == "name = \"" n "\"" {getline; gsub(/version = |"/, ""); print; exit}' uv.lock
}
download() {  # download ARGS...: binary wheels for the target Python, without dependencies
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --dest "$1" "${@:2}"
}

# Ray: unpack, restore the executable bits (zipfile drops them: gcs_server and raylet would not start), strip.
ray_version=$(locked ray)
download "$WORK" "ray==$ray_version"
python3 - "$WORK" <<'PY'
import os, sys, zipfile
work = sys.argv[1]
wheel = next(f for f in os.listdir(work) if f.startswith("ray-") and f.endswith(".whl"))
with zipfile.ZipFile(os.path.join(work, wheel)) as z:
    for info in z.infolist():
        path = z.extract(info, os.path.join(work, "ray_tree"))
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)
PY
tree=$WORK/ray_tree
rm -rf "$tree"/ray/{jars,rllib,data,serve,train,tune,llm} "$tree"/ray/dashboard/client/build
tar -cJf "$OUT/ray-$ray_version-stripped.tar.xz" -C "$tree" .
echo "[gpu_wheels] $OUT/ray-$ray_version-stripped.tar.xz: $(du -h "$OUT/ray-$ray_version-stripped.tar.xz" | cut -f1)"

# The rest, at the lock's versions: what the workspace and the GPU tests import that the image lacks.
names=(megatron-core gymnasium farama-notifications mujoco cattrs tensorboardx array-api-compat gguf glfw
    jsonschema jsonschema-specifications referencing rpds-py math-verify latex2sympy2-extended
    antlr4-python3-runtime)
specs=()
for n in "${names[@]}"; do specs+=("$n==$(locked "$n")"); done
download "$OUT" "${specs[@]}"
ls -la "$OUT"
echo "[gpu_wheels] $(du -sh "$OUT" | cut -f1) in $OUT (the device machine takes 64 MB with the working tree)"
