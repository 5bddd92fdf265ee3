#!/usr/bin/env bash
# One pass over the GPU paths on a CUDA machine: the gpu-marked tests, the GPU benchmarks, and the embodied and
# reasoning apps with their workers placed on the real GPU. Every step has its own time limit and log; a failing
# step does not stop the others. Logs go to $OUT (default /tmp/rlinf_gpu_check). With a second source tree in
# RLINF_GPU_BASELINE_SRC (a directory holding packages/*/src of another commit), bench/gpu_actor_step.py runs on
# it too, before the current tree, for an A/B in the same run.
#
# On a machine with the workspace synced (uv sync, CUDA torch): RLINF_GPU_PYTHON="uv run python" bash scripts/gpu_check.sh
# On an offline machine whose python3 has CUDA torch: `bash scripts/gpu_wheels.sh` here builds .whl/ (the missing wheels,
# and Ray as an unpacked install archived); carry .whl/ there, then: bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rlinf_gpu_check}
mkdir -p "$OUT"
PY=${RLINF_GPU_PYTHON:-python3}
STEPS=${RLINF_GPU_STEPS:-bench tests apps}  # a subset of: bench tests apps
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

step() {  # step NAME LIMIT_S LOG COMMAND...: run one step with a time limit, append to LOG, print its status
    local name=$1 limit=$2 log=$3
    shift 3
    local t0=$SECONDS
    echo "===== $name (limit ${limit}s)" >>"$log"
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    echo "===== $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$log"
}

if [ -z "${RLINF_GPU_PYTHON:-}" ] && [ -d .whl ]; then
    echo "[gpu_check] installing the carried wheels into /tmp/rlinf_site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rlinf_site .whl/*.whl || exit 1
    for a in .whl/*.tar.xz; do [ -e "$a" ] && tar -xJf "$a" -C /tmp/rlinf_site; done
    # The workspace packages run from packages/*/src; give them the metadata importlib.metadata reads.
    for pkg in packages/*/; do
        name=$(basename "$pkg")
        ver=$(sed -n 's/^version = "\(.*\)"/\1/p' "$pkg/pyproject.toml" | head -n 1)
        info=/tmp/rlinf_site/${name//-/_}-$ver.dist-info
        mkdir -p "$info" && printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$ver" >"$info/METADATA"
    done
    export PYTHONPATH=/tmp/rlinf_site
fi
SITE_PATH=${PYTHONPATH:-}  # the carried wheels (or nothing): under either source tree
for src in packages/*/src; do PYTHONPATH="$PWD/$src${PYTHONPATH:+:$PYTHONPATH}"; done
export PYTHONPATH

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import sys, torch, ray, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'ray', ray.__version__, 'transformers', transformers.__version__)"
    $PY -c "import megatron.core as m; print('megatron-core', m.__version__)" 2>&1 | tail -1
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

# 1. Benchmarks first, alone on the GPU.
if [[ " $STEPS " == *" bench "* ]]; then
if [ -n "${RLINF_GPU_BASELINE_SRC:-}" ]; then
    base_path=$(printf '%s:' "$RLINF_GPU_BASELINE_SRC"/packages/*/src)${SITE_PATH:-}
    step "bench/gpu_actor_step.py on $RLINF_GPU_BASELINE_SRC" 120 "$OUT/bench.log" env PYTHONPATH="$base_path" \
        $PY bench/gpu_actor_step.py --json "$OUT/actor_step_baseline_src.json"
fi
step "bench/gpu_actor_step.py" 150 "$OUT/bench.log" $PY bench/gpu_actor_step.py --profile --json "$OUT/actor_step.json"
step "bench/gpu_p2p.py" 90 "$OUT/bench.log" $PY bench/gpu_p2p.py --mb 64 256 1024
fi

# 2. Functional checks side by side (each starts its own local Ray instance).
TESTS=(${RLINF_GPU_TESTS:-
    packages/rlinf-scheduler/tests/test_sched_comm_cuda.py
    packages/rlinf-scheduler/tests/test_sched_comm.py
    packages/rlinf-models/tests/test_models_actor_worker_gpu.py
    packages/rlinf-models/tests/test_models_megatron_gpu.py
    packages/rlinf-models/tests/test_models_pi0_gpu.py
    packages/rlinf-rollout/tests/test_rollout_sglang_gpu.py
})
[[ " $STEPS " == *" tests "* ]] && step "pytest -m gpu" 240 "$OUT/pytest.log" $PY -m pytest -p no:cacheprovider -m gpu -v -rs \
    --timeout 200 -n 3 --dist loadfile "${TESTS[@]}" &
# Tests that are not gpu-marked but skip on the development box for a package the GPU image has (torchvision).
CPU_TESTS=(${RLINF_GPU_CPU_TESTS:-packages/rlinf-models/tests/test_models_llm_vlm.py})
[[ " $STEPS " == *" tests "* ]] && step "pytest (image-only packages)" 240 "$OUT/pytest_cpu.log" $PY -m pytest \
    -p no:cacheprovider -v -rs --timeout 200 "${CPU_TESTS[@]}" &

# Which processes hold GPU memory while the apps run (evidence that their workers are on the GPU).
(for _ in $(seq 40); do nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader; sleep 5; done \
    >"$OUT/gpu_processes.log" 2>&1) &
sampler=$!

if [[ " $STEPS " == *" apps "* ]]; then
REAL_GPU=(cluster.simulated_accelerators_per_node=0 runner.progress_bar=false runner.logger.logger_backends=[])
step "embodied cartpole_ppo on the GPU" 180 "$OUT/apps.log" $PY apps/embodied/train.py "${REAL_GPU[@]}" \
    runner.max_epochs=6 runner.stop_eval_return=null runner.logger.log_path=/tmp/rlinf_gpu_runs/cartpole_ppo &
step "embodied pendulum_sac on the GPU" 180 "$OUT/apps_sac.log" $PY apps/embodied/train.py --config-name pendulum_sac \
    "${REAL_GPU[@]}" runner.max_epochs=12 runner.stop_eval_return=null \
    runner.logger.log_path=/tmp/rlinf_gpu_runs/pendulum_sac &
step "embodied inverted_pendulum_ppo_flow on the GPU" 200 "$OUT/apps_flow.log" $PY apps/embodied/train.py \
    --config-name inverted_pendulum_ppo_flow "${REAL_GPU[@]}" runner.max_epochs=6 runner.stop_eval_return=null \
    runner.val_check_interval=3 runner.save_interval=6 runner.logger.log_path=/tmp/rlinf_gpu_runs/pendulum_flow &

$PY -c "from rlinf_models.llm.testing import make_tiny_model_dir as m; m('/tmp/rlinf_tiny_lm', hidden_size=256, num_layers=4)" \
    >>"$OUT/apps_llm.log" 2>&1
step "reasoning grpo (tiny qwen2) on the GPU" 220 "$OUT/apps_llm.log" $PY apps/reasoning/train.py "${REAL_GPU[@]}" \
    actor.model.model_path=/tmp/rlinf_tiny_lm data.rollout_batch_size=8 data.eval_size=16 algorithm.group_size=4 \
    actor.global_batch_size=32 actor.micro_batch_size=8 rollout.sampling.max_new_tokens=32 sft.steps=2 \
    runner.max_epochs=3 runner.val_check_interval=3 runner.save_interval=3 \
    runner.logger.log_path=/tmp/rlinf_gpu_runs/grpo_tiny &
fi
wait $(jobs -p | grep -v "^${sampler:-x}$") 2>/dev/null
kill "${sampler:-}" 2>/dev/null
for run in cartpole_ppo pendulum_sac pendulum_flow grpo_tiny; do
    f=/tmp/rlinf_gpu_runs/$run/metrics.jsonl
    [ -f "$f" ] && { echo "== $run: last metrics line"; tail -n 1 "$f" | cut -c1-1500; } >>"$OUT/apps.log"
done
echo "[gpu_check] done; logs in $OUT"
