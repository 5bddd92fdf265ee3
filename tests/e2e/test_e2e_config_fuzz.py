"""Bad configurations of every app are refused before Ray starts: exit code 2, the key and the allowed values.

Each case runs the apps' command line (``rlinf_runners.cli.main``, as ``apps/<app>/train.py`` does) with
``--print-config``, so a config that got through would print and exit 0 instead of 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rlinf_runners.cli import main

ROOT = Path(__file__).resolve().parents[2]

E, R, A = "embodied", "reasoning", "agent"
SAC = ["--config-name", "pendulum_sac"]
ASYNC_SAC = ["--config-name", "pendulum_async_sac"]
# (app, arguments, texts the error must contain: the key, and the allowed values where there is a closed set)
CASES: list[tuple[str, list[str], list[str]]] = [
    # runner
    (E, ["runner.max_epochs=-3"], ["runner.max_epochs", ">= 1"]),
    (E, ["runner.max_epoch=3"], ["runner.max_epoch", "did you mean 'runner.max_epochs'"]),
    (E, ["runner.save_interval=-2"], ["runner.save_interval", ">= -1"]),
    (E, ["runner.step_timeout_s=0"], ["runner.step_timeout_s", "> 0"]),
    (E, ["runner.max_checkpoints_to_keep=0"], ["runner.max_checkpoints_to_keep", ">= 1 or null"]),
    (E, ["runner.logger.logger_backends=[tensorbord]"], ["logger_backends", "tensorboard, wandb, swanlab"]),
    (E, ["runner.logger.log_pth=x"], ["runner.logger.log_pth", "log_path"]),
    (E, ["runner.progress_bar=maybe"], ["runner.progress_bar", "expected bool"]),
    (E, ["runner.resume_dir=/nonexistent/global_step_3"], ["runner.resume_dir", "does not exist", "'auto'"]),
    (E, ["runner.seed=abc"], ["runner.seed", "expected int"]),
    (E, ["~runner"], ["~runner", "whole section"]),
    (E, ["~runner.nonexistent_key"], ["runner.nonexistent_key", "no runner.nonexistent_key to remove"]),
    (E, ["runner.mode=asynch"], ["runner.mode", "'sync', 'async'"]),
    (E, ["runner.mode=async"], ["runner.mode 'async'", "algorithm.loss_type", "'decoupled_actor_critic'"]),
    (E, ["algorithm.staleness_threshold=-1"], ["algorithm.staleness_threshold", ">= 0"]),
    (R, ["runner.mode=async"], ["runner.mode"]),
    # algorithm: registries and ranges
    (E, ["algorithm.adv_type=gea"], ["algorithm.adv_type", "'gea'", "gae, grpo, grpo_dynamic"]),
    (E, ["algorithm.adv_type=raw"], ["algorithm.adv_type 'raw'", "env.train.auto_reset: false"]),
    (
        E,
        ["algorithm.adv_type=grpo_dynamic"],
        ["algorithm.adv_type 'grpo_dynamic'", "allowed: gae, grpo, raw"],
    ),
    (
        E,
        ["algorithm.loss_type=ppo_x"],
        ["algorithm.loss_type", "actor, actor_critic, decoupled_actor_critic"],
    ),
    (E, ["algorithm.gamma=1.5"], ["algorithm.gamma", "<= 1.0"]),
    (E, ["algorithm.gae_lambda=-0.1"], ["algorithm.gae_lambda", ">= 0.0"]),
    (E, ["algorithm.reward_type=episode_level"], ["algorithm.reward_type", "'chunk_level', 'action_level'"]),
    (E, ["algorithm.kl_penalty=k9"], ["algorithm.kl_penalty", "'low_var_kl'"]),
    (E, ["algorithm.clip_ratio_c=0.5"], ["clip_ratio_c", "> 1"]),
    (E, ["algorithm.update_epoch=0"], ["algorithm.update_epoch", ">= 1"]),
    (E, ["algorithm.loss_agg_func=mean"], ["algorithm.loss_agg_func", "'token-mean'"]),
    (E, ["algorithm.group_size=3"], ["algorithm.group_size", "env.train.group_size"]),
    (E, ["algorithm.loss_type=actor"], ["loss_type", "'actor_critic'"]),
    # actor
    (E, ["actor.model.hidden_sizes=[64,-1]"], ["actor.model.hidden_sizes", "> 0"]),
    (E, ["actor.model.activation=gelu2"], ["actor.model.activation", "'tanh', 'relu', 'gelu'"]),
    (E, ["actor.model.model_type=transformer_xl"], ["actor.model.model_type", "'mlp', 'cnn'"]),
    (E, ["actor.model.num_action_chunks=3"], ["actor.model.num_action_chunks (3)"]),
    (E, ["actor.model.lora_sync=delta"], ["actor.model.lora_sync", "'merged', 'adapters'"]),
    (
        E,
        ["actor.model.lora_sync=adapters"],
        ["actor.model", "lora_sync 'adapters'", "is_lora: true", "'merged'"],
    ),
    (E, ["actor.optim.lr=-1"], ["actor.optim.lr", "> 0"]),
    (E, ["actor.optim.lr_schedule=cosine2"], ["actor.optim.lr_schedule", "'constant', 'linear'"]),
    (E, ["actor.global_batch_size=100000"], ["actor.global_batch_size", "actor.micro_batch_size"]),
    (E, ["actor.micro_batch_size=7"], ["actor.micro_batch_size (7)"]),
    (E, ["actor.training_backend=megatron"], ["actor.training_backend", "'fsdp'"]),
    (E, ["actor.modell.hidden_sizes=[8]"], ["actor.modell", "did you mean 'actor.model'"]),
    # rollout and env
    (E, ["rollout.pipeline_stage_num=0"], ["rollout.pipeline_stage_num", ">= 1"]),
    (E, ["rollout.pipeline_stage_num=3"], ["env.train.total_num_envs (8)", "rollout.pipeline_stage_num (3)"]),
    (E, ["env.train.env_id=CartPol-v1"], ["env.train.env_id", "did you mean 'CartPole-v1'", "registered:"]),
    (E, ["env.eval.env_type=isaaclab"], ["env.eval.env_type", "'gymnasium', 'maniskill'"]),
    (E, ["env.train.total_num_envs=7"], ["actor.global_batch_size (256)", "env.train.total_num_envs"]),
    (E, ["env.train.reward_mode=shaped"], ["env.train.reward_mode", "'normalized_dense', 'dense', 'sparse'"]),
    (E, ["env.train.vector_mode=threads"], ["env.train.vector_mode", "'sync', 'async'"]),
    (E, ["env.train.max_episode_steps=0"], ["env.train.max_episode_steps", ">= 1 or null"]),
    (E, ["env.trian.seed=1"], ["env.trian", "did you mean 'env.train'"]),
    (E, ["env.train.auto_reset=yes_please"], ["env.train.auto_reset", "expected bool"]),
    # cluster and placement
    (
        E,
        ['cluster.component_placement={"actor,env,rollout,critic": 0}'],
        ["['critic']", "actor, rollout, env"],
    ),
    (E, ['cluster.component_placement={"actor,rollout": 0}'], ["no placement for ['env']"]),
    (E, ['cluster.component_placement={"actor,env,rollout": "0-3"}'], ["'0-3'", "out of range"]),
    (E, ['cluster.component_placement={"actor,env,rollout": "x"}'], ["placement 'x'", "'all'"]),
    (E, ["cluster.num_nodes=0"], ["cluster.num_nodes", ">= 1"]),
    (E, ["cluster.simulated_accelerators_per_node=-1"], ["cluster.simulated_accelerators_per_node", ">= 0"]),
    (E, ["cluster.node_groups=[{label: cluster, node_ranks: [0]}]"], ["label 'cluster' is reserved"]),
    (E, ["clusterr.num_nodes=1"], ["clusterr", "did you mean 'cluster'"]),
    # the command line
    (E, ["--config-name", "no_such_config"], ["'no_such_config' not found", "cartpole_ppo"]),
    (E, ["--frobnicate"], ["'--frobnicate'", "--config-name, --config"]),
    (E, ["runner.max_epochs"], ["'runner.max_epochs'", "key.sub=value"]),
    (E, ["runner.max_epochs=[1"], ["'runner.max_epochs=[1'", "not valid YAML"]),
    (E, ["runner.max_epochs=3", "runner.max_epochs.x=1"], ["runner.max_epochs is a int, not a mapping"]),
    # embodied off-policy (SAC): its algorithm fields, buffers and cross-section checks
    (E, ["algorithm.loss_type=embodied_sacc"], ["algorithm.loss_type", "embodied_sac"]),
    (
        E,
        ["algorithm.loss_type=embodied_sac"],
        ["adv_type 'gae'", "selected by both together", "embodied_sac"],
    ),
    (
        E,
        ["actor.model.add_q_head=true", "actor.model.add_value_head=false", "algorithm.adv_type=grpo"],
        ["actor.model.add_q_head builds the off-policy policy", "embodied_sac"],
    ),
    (
        E,
        [*SAC, "algorithm.entropy_tuning.alpha_type=log"],
        ["alpha_type", "'softplus', 'exp', 'fixed_alpha'"],
    ),
    (
        E,
        [*SAC, "algorithm.entropy_tuning.initial_alpha=0"],
        ["algorithm.entropy_tuning.initial_alpha", "> 0"],
    ),
    (E, [*SAC, "algorithm.agg_q=max"], ["algorithm.agg_q", "'min', 'mean'"]),
    (E, [*SAC, "algorithm.q_head_type=crossx"], ["algorithm.q_head_type", "'default', 'crossq'"]),
    (E, [*SAC, "algorithm.tau=1.5"], ["algorithm.tau", "<= 1.0"]),
    (E, [*SAC, "algorithm.utd_ratio=0"], ["algorithm.utd_ratio", "> 0 or null"]),
    (E, [*SAC, "algorithm.replay_buffer.cache_size=0"], ["algorithm.replay_buffer.cache_size", ">= 1"]),
    (E, [*SAC, "algorithm.replay_buffer.min_buffer_size=200000"], ["min_buffer_size (200000)", "cache_size"]),
    (E, [*SAC, "algorithm.replay_buffer.window=5"], ["algorithm.replay_buffer.window", "sample_window_size"]),
    (E, [*SAC, "algorithm.demo_buffer.load_path=/nonexistent.pt"], ["algorithm.demo_buffer.load_path"]),
    (E, [*SAC, "actor.model.add_q_head=false"], ["actor.model.add_q_head must be true"]),
    (E, [*SAC, "actor.model.add_value_head=true"], ["add_value_head", "add_q_head"]),
    (E, [*SAC, "actor.model.num_q_heads=0"], ["actor.model.num_q_heads", ">= 1"]),
    (E, [*SAC, "env.train.auto_reset=false"], ["env.train.auto_reset must be true"]),
    (E, [*ASYNC_SAC, "algorithm.staleness_threshold=-2"], ["algorithm.staleness_threshold", ">= 0"]),
    (E, [*ASYNC_SAC, "runner.mode=asynch"], ["runner.mode", "'sync', 'async'"]),
    (
        E,
        [
            *SAC,
            "cluster.simulated_accelerators_per_node=2",
            'cluster.component_placement={actor: 0-1, "env,rollout": 0}',
            "actor.global_batch_size=255",
            "actor.micro_batch_size=255",
        ],
        ["actor.global_batch_size (255) must split evenly over the 2 off-policy actor ranks"],
    ),
    (
        E,
        [
            *SAC,
            "cluster.simulated_accelerators_per_node=2",
            'cluster.component_placement={actor: 0-1, "env,rollout": 0}',
            "algorithm.q_head_type=crossq",
        ],
        ["algorithm.q_head_type: crossq runs on one actor rank", "gives the actor 2"],
    ),
    # reasoning: paths, registries, sections of its own
    (R, ["actor.model.model_path=/nonexistent/model"], ["actor.model.model_path", "'smollm2-135m-instruct'"]),
    (R, ["actor.model.tokenizer_path=/nonexistent/tok"], ["actor.model.tokenizer_path", "not a directory"]),
    (R, ["data.train_path=/nonexistent.jsonl"], ["data.train_path", "prepare_data.py"]),
    (R, ["reward.reward_type=maths"], ["reward.reward_type", "math, searchr1"]),
    (R, ["algorithm.adv_type=grpo_video"], ["algorithm.adv_type 'grpo_video'", "grpo, reinpp, gae"]),
    (R, ["rollout.engine=tensorrt"], ["rollout.engine", "'hf', 'vllm', 'sglang'"]),
    (R, ["actor.training_backend=deepspeed"], ["actor.training_backend", "'fsdp', 'megatron'"]),
    (R, ["rollout.sampling.temperature=-1"], ["rollout.sampling.temperature", ">= 0"]),
    (R, ["sft.steps=-1"], ["sft.steps", ">= 0"]),
    (R, ["data.rollout_batch_size=0"], ["data.rollout_batch_size", ">= 1"]),
    (R, ['cluster.component_placement={"actor,rollout": 0}'], ["no placement for ['reward']"]),
    (R, ["actor.model.dtype=float8"], ["actor.model.dtype", "'float32', 'bfloat16'"]),
    # agent
    (A, ["actor.model.model_path=/nonexistent/model"], ["actor.model.model_path", "not a directory"]),
    (A, ["algorithm.adv_type=reinpp"], ["algorithm.adv_type 'reinpp'", "grpo_dynamic, grpo"]),
    (A, ["tools.enabled=[calculator, teleport]"], ["tools.enabled", "['teleport']", "calculator, search"]),
    (A, ["agent.max_turns=0"], ["agent.max_turns", ">= 1"]),
    (A, ["data.eval_path=/nonexistent.jsonl"], ["data.eval_path", "does not exist"]),
    (A, ["reward.reward_type=unknown_reward"], ["reward.reward_type", "math, searchr1"]),
]

# Whole files: malformed YAML, an empty file, a repeated key, a list at the top, a missing `defaults` entry.
FILES: list[tuple[str, str, list[str]]] = [
    ("malformed", "runner:\n  max_epochs: [3\n", ["invalid YAML"]),
    ("empty", "# nothing here\n", ["the file is empty"]),
    ("duplicate", "runner:\n  max_epochs: 3\n  max_epochs: 4\n", ["duplicate key 'max_epochs'", "line 3"]),
    ("toplist", "- runner\n", ["top level must be a mapping"]),
    ("nodefaults", "defaults: [no_such_base]\n", ["defaults: 'no_such_base' not found"]),
]


def _run(app: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(app, ["--print-config", *argv], mode="train", app_dir=ROOT / "apps" / app)
    out = capsys.readouterr()
    assert rc == 2, f"accepted (exit {rc}):\n{out.out[-500:]}{out.err[-500:]}"
    assert out.out == "", "a refused config printed something on stdout"
    assert out.err.startswith("error: ") and "Traceback" not in out.err, out.err
    return out.err


@pytest.mark.parametrize(("app", "argv", "expected"), CASES, ids=[f"{a}:{' '.join(v)}" for a, v, _ in CASES])
def test_bad_config_is_refused_before_ray_naming_key_and_allowed_values(
    app: str, argv: list[str], expected: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    err = _run(app, argv, capsys)
    for text in expected:
        assert text in err, f"{text!r} missing from:\n{err}"
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


@pytest.mark.parametrize(("name", "text", "expected"), FILES, ids=[f for f, _, _ in FILES])
def test_bad_config_file_is_refused_before_ray(
    name: str, text: str, expected: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    err = _run(E, ["--config", str(path)], capsys)
    for want in expected:
        assert want in err, f"{want!r} missing from:\n{err}"
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_the_fuzz_covers_every_section_of_every_app() -> None:
    assert len(CASES) + len(FILES) >= 50
    sections = {(app, arg.lstrip("~").split(".")[0]) for app, argv, _ in CASES for arg in argv}
    for section in ("runner", "algorithm", "actor", "rollout", "env", "cluster"):
        assert (E, section) in sections, section
    for app in (R, A):
        assert {s for a, s in sections if a == app} >= {"actor", "data", "reward", "algorithm"}
