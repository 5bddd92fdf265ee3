#!/usr/bin/env bash
# Resident memory of the reasoning app's actor and rollout workers over GRPO steps, sampled every 10 s.
#
#   RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 bash bench/worker_memory.sh LABEL STEPS [VAR=VALUE ...]
#
# Runs the default reasoning config (grpo_smollm2_cpu, one generation batch per step, no SFT warm-up, no
# evaluation or checkpoints) for STEPS steps with the given environment variables (e.g. MALLOC_ARENA_MAX=16 for
# glibc's default arena count on two cores), prints one line per sample ("<process>=<MB>MB ... <time>"), and
# leaves the run's metrics in /tmp/worker_memory_LABEL/metrics.jsonl (time/step_s, time/train_s, ...).
set -euo pipefail
label=$1
steps=$2
shift 2
log=/tmp/worker_memory_$label
echo "== $label $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
env "$@" uv run apps/reasoning/train.py --config-name grpo_smollm2_cpu algorithm.dynamic_sampling=false \
    runner.max_epochs="$steps" runner.max_steps=-1 runner.val_check_interval=-1 runner.save_interval=-1 \
    runner.progress_bar=false sft.steps=0 runner.logger.log_path="$log" runner.logger.logger_backends=[] \
    > "$log.out" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
    ps -eo rss,comm --sort=-rss | awk '/LLMActor|LLMRollout/{printf "%s=%dMB ", $2, $1/1024}'
    echo " $(date +%T)"
    sleep 10
done
wait "$pid"
tail -3 "$log.out"
