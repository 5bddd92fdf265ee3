"""The embodied app's configs and command line, checked before Ray starts (no Ray in this module)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlinf_core.config import ConfigError
from rlinf_runners.apps import EmbodiedApp

from .conftest import APP_DIR

CONFIGS = sorted(p.stem for p in (APP_DIR / "config").glob("*.yaml"))


def test_every_issue_config_exists() -> None:
    expected = {
        "cartpole_ppo",
        "cartpole_grpo",
        "pendulum_ppo",
        "halfcheetah_ppo",
        "maniskill_pushcube_ppo",
        "maniskill_pickcube_ppo",
        "cartpole_async_ppo",
        "maniskill_pushcube_async_ppo",
        "pendulum_async_sac",
        "maniskill_pickcube_sac",
        "maniskill_pickcube_rlpd",
        "libero_spatial_ppo_mlp",
        "libero_spatial_grpo_mlp",
        "libero_spatial_ppo_cnn",
        "libero_spatial_ppo_pi0_tiny",
        "libero_spatial_ppo_openpi",
        "libero_spatial_ppo_openpi_pi05",
        "libero_spatial_ppo_smolvla_tiny",
        "libero_spatial_ppo_smolvla",
        "libero_spatial_ppo_gr00t_tiny",
        "libero_spatial_ppo_gr00t",
        "libero_spatial_ppo_openvla_tiny",
        "libero_spatial_ppo_openvla",
        "libero_spatial_ppo_openvlaoft_tiny",
        "realworld_dummy_franka_sac_cnn",
    }
    assert expected <= set(CONFIGS)


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny demo buffer file: configs with ``algorithm.demo_buffer`` need one to pass their checks."""
    import torch
    from rlinf_models.offpolicy import ReplayBuffer

    buf = ReplayBuffer(2)
    buf.add({"obs": torch.zeros(2, 3), "rewards": torch.zeros(2, 1)})
    path = tmp_path_factory.mktemp("demos") / "demos.pt"
    buf.save(path)
    return path


_TINY_FILES = {"model_path": "model", "tokenizer_path": "tokenizer", "norm_stats_path": "norm_stats.json"}


def _load(app: EmbodiedApp, name: str, demo_file: Path) -> Any:
    """Load a shipped config; its demo buffer and DAgger expert (generated, not shipped) replaced by stand-ins."""
    path = APP_DIR / "config" / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    overrides = []
    if (raw.get("algorithm") or {}).get("demo_buffer"):
        overrides.append(f"algorithm.demo_buffer.load_path={demo_file}")
    model = (raw.get("actor") or {}).get("model") or {}
    if model.get("model_type") in ("pi0", "pi05"):
        # A tiny model of the config's type stands in for the checkpoint (real ones are not shipped).
        from rlinf_models.pi0.testing import make_tiny_pi0

        tiny = demo_file.parent / f"tiny_{model['model_type']}"
        if not tiny.exists():
            make_tiny_pi0(tiny, pi05=model["model_type"] == "pi05")
        overrides += [f"actor.model.{k}={tiny / v}" for k, v in _TINY_FILES.items()]
    if model.get("model_type") == "smolvla":
        from rlinf_models.smolvla.testing import make_tiny_smolvla

        paths = make_tiny_smolvla(demo_file.parent / "tiny_smolvla")
        overrides += [f"actor.model.{k}={v}" for k, v in paths.items()]
    if model.get("model_type") == "gr00t":
        from rlinf_models.gr00t.testing import make_tiny_gr00t

        paths = make_tiny_gr00t(demo_file.parent / "tiny_gr00t")
        overrides += [f"actor.model.{k}={v}" for k, v in paths.items()]
    if model.get("model_type") == "openvla":
        from rlinf_models.openvla.testing import make_tiny_openvla

        tiny = demo_file.parent / "tiny_openvla"
        if not tiny.exists():
            make_tiny_openvla(tiny)
        overrides.append(f"actor.model.model_path={tiny}")
    if model.get("model_type") == "openvla_oft":
        from rlinf_models.openvla.testing import make_tiny_openvla_oft

        tiny = demo_file.parent / "tiny_openvla_oft"
        if not tiny.exists():
            make_tiny_openvla_oft(tiny)
        # The tiny model's statistics are LIBERO's (the ManiSkill config names Bridge's).
        overrides += [f"actor.model.model_path={tiny}", "actor.model.unnorm_key=libero_spatial_no_noops"]
    if (raw.get("actor") or {}).get("expert"):
        expert = (
            demo_file.parent / "global_step_1" / "actor" / "model.pt"
        )  # only its presence is checked here
        expert.parent.mkdir(parents=True, exist_ok=True)
        expert.touch()
        overrides.append(f"actor.expert.checkpoint={expert.parent.parent}")
    return app.load_config(path, overrides)


@pytest.mark.parametrize("name", CONFIGS)
def test_configs_load_and_pass_the_cross_checks(app: EmbodiedApp, name: str, demo_file: Path) -> None:
    cfg = _load(app, name, demo_file)
    sizes = app.world_sizes(cfg)
    if cfg.cluster.simulated_accelerators_per_node == 0:  # a GPU config: sizes come from the real devices
        assert sizes is None
        return
    assert sizes is not None and set(sizes) == {"actor", "rollout", "env"}


def test_every_placement_mode_is_shown(app: EmbodiedApp, demo_file: Path) -> None:
    from rlinf_scheduler import resolve_placement

    modes = set()
    for name in CONFIGS:
        cfg = _load(app, name, demo_file)
        if cfg.cluster.simulated_accelerators_per_node == 0:
            continue  # a GPU config
        out = resolve_placement(
            cfg.cluster,
            num_nodes=cfg.cluster.num_nodes,
            accelerators_per_node=cfg.cluster.simulated_accelerators_per_node,
        )
        devices = {c: {a for p in out[c] for a in p.resource_ranks} for c in ("actor", "rollout", "env")}
        if devices["actor"] == devices["rollout"] == devices["env"]:
            modes.add("collocated")
        elif not (
            devices["actor"] & devices["rollout"]
            or devices["actor"] & devices["env"]
            or devices["rollout"] & devices["env"]
        ):
            modes.add("disaggregated")
        else:
            modes.add("hybrid")
    assert modes == {"collocated", "disaggregated", "hybrid"}


def test_pi0_files_are_checked_at_load(app: EmbodiedApp, tmp_path: Path) -> None:
    from rlinf_models.pi0.testing import make_tiny_pi0

    paths = make_tiny_pi0(tmp_path / "tiny")
    config = APP_DIR / "config" / "libero_spatial_ppo_pi0_tiny.yaml"
    good = [f"actor.model.{k}={v}" for k, v in paths.items()]
    assert app.load_config(config, good).actor.model.model_type == "pi0"
    with pytest.raises(ConfigError) as err:
        app.load_config(
            config,
            [
                *good,
                "actor.model.model_type=pi05",
                f"actor.model.tokenizer_path={tmp_path / 'absent'}",
            ],
        )
    text = str(err.value)
    assert (
        "actor.model.model_type 'pi05' does not match" in text
        and "allowed: pi0, pi05, smolvla, gr00t, openvla, openvla_oft" in text
    )
    assert f"actor.model.tokenizer_path: no tokenizer directory at {tmp_path / 'absent'}" in text
    with pytest.raises(
        ConfigError,
        match=r"is not a LeRobot pi0 checkpoint directory \(missing config\.json, model\.safetensors",
    ):
        app.load_config(config, [*good, f"actor.model.model_path={tmp_path}"])
    # A runner's global_step_<N> without the pretrained/ export (an RL checkpoint): not a VLA model_path.
    rl_step = tmp_path / "global_step_2"
    (rl_step / "actor").mkdir(parents=True)
    (rl_step / "actor" / "model.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"actor\.model\.model_path: .* no pretrained/ export"):
        app.load_config(config, [*good, f"actor.model.model_path={rl_step}"])
    with pytest.raises(ConfigError, match="needs tokenizer_path"):
        app.load_config(config, [*good, "actor.model.tokenizer_path=null"])


def test_openvla_files_and_keys_are_checked_at_load(app: EmbodiedApp, tmp_path: Path) -> None:
    from rlinf_models.openvla.testing import make_tiny_openvla

    tiny = make_tiny_openvla(tmp_path / "tiny")
    config = APP_DIR / "config" / "libero_spatial_ppo_openvla_tiny.yaml"
    good = [f"actor.model.model_path={tiny}"]
    assert app.load_config(config, good).actor.model.model_type == "openvla"
    with pytest.raises(ConfigError) as err:
        app.load_config(
            config,
            [
                *good,
                "actor.model.unnorm_key=bridge_orig",
                f"actor.model.tokenizer_path={tmp_path / 'absent'}",
            ],
        )
    text = str(err.value)
    assert "actor.model.unnorm_key 'bridge_orig' is not in the checkpoint's norm_stats; allowed: " in text
    assert "libero_spatial_no_noops" in text
    assert (
        f"actor.model.tokenizer_path: no tokenizer (tokenizer_config.json) in {tmp_path / 'absent'}" in text
    )
    with pytest.raises(ConfigError, match=r"is not an OpenVLA checkpoint directory \(needs config\.json"):
        app.load_config(config, [f"actor.model.model_path={tmp_path}"])
    with pytest.raises(ConfigError, match="num_action_chunks must be 1 for model_type 'openvla'"):
        app.load_config(config, [*good, "actor.model.num_action_chunks=2"])
    with pytest.raises(ConfigError, match="norm_stats_path does not apply to model_type 'openvla'"):
        app.load_config(config, [*good, f"actor.model.norm_stats_path={tiny / 'config.json'}"])


def test_cross_field_problems_are_listed_with_their_paths(app: EmbodiedApp) -> None:
    with pytest.raises(ConfigError) as err:
        app.load_config(
            APP_DIR / "config" / "cartpole_ppo.yaml",
            [
                "rollout.pipeline_stage_num=3",
                "actor.global_batch_size=4096",
                "actor.micro_batch_size=4096",
                "algorithm.group_size=2",
                "env.train.max_steps_per_rollout_epoch=30",
                "actor.model.num_action_chunks=4",
            ],
        )
    text = str(err.value)
    for fragment in (
        "env.train.total_num_envs (8) must be a multiple of env ranks (1) x rollout.pipeline_stage_num (3)",
        "actor.global_batch_size (4096) exceeds the samples one step collects",
        "algorithm.group_size (2) must equal env.train.group_size (1)",
        "env.train.max_steps_per_rollout_epoch (30) must be a multiple of actor.model.num_action_chunks (4)",
    ):
        assert fragment in text


def test_flow_policy_on_discrete_actions_is_refused_at_load(app: EmbodiedApp) -> None:
    with pytest.raises(
        ConfigError, match=r"actor\.model\.model_type 'flow' needs continuous actions.*CartPole-v1"
    ):
        app.load_config(APP_DIR / "config" / "cartpole_ppo.yaml", ["actor.model.model_type=flow"])
    # SAC with the flow policy is SAC-Flow: every denoising step stochastic, so one-step log-probs are refused
    assert app.load_config(APP_DIR / "config" / "pendulum_sac.yaml", ["actor.model.model_type=flow"])
    with pytest.raises(ConfigError, match=r"joint_logprob: false .* is on-policy only"):
        app.load_config(
            APP_DIR / "config" / "pendulum_sac.yaml",
            ["actor.model.model_type=flow", "actor.model.joint_logprob=false"],
        )


def test_placement_without_a_component_is_an_error(app: EmbodiedApp) -> None:
    with pytest.raises(ConfigError, match=r"no placement for \['env'\]"):
        app.load_config(
            APP_DIR / "config" / "cartpole_ppo.yaml", ['cluster.component_placement={"actor,rollout": 0}']
        )


def _train(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(APP_DIR / "train.py"), *args], capture_output=True, text=True, timeout=120
    )


def test_train_print_config_and_bad_override_exit_codes(tmp_path: Path) -> None:
    out = _train("--print-config", "runner.max_epochs=7")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["runner"]["max_epochs"] == 7
    bad = _train("runner.max_epoch=7", "env.train.total_num_envs=oops")
    assert bad.returncode == 2
    assert "runner.max_epoch: unknown key (did you mean 'runner.max_epochs'?)" in bad.stderr
    assert "env.train.total_num_envs: expected int" in bad.stderr
    assert _train("--config-name", "nope").returncode == 2


def test_dagger_without_its_expert_fails_before_ray_naming_the_command(
    app: EmbodiedApp, tmp_path: Path
) -> None:
    path = APP_DIR / "config" / "maniskill_pushcube_rgb_dagger.yaml"
    with pytest.raises(ConfigError) as err:
        app.load_config(path, [f"actor.expert.checkpoint={tmp_path / 'nothing'}"])
    text = str(err.value)
    assert "actor.expert.checkpoint: no expert weights at" in text and "maniskill_pushcube_ppo" in text


def test_a_missing_model_path_fails_at_config_load(app: EmbodiedApp, tmp_path: Path) -> None:
    path = APP_DIR / "config" / "cartpole_ppo.yaml"
    with pytest.raises(
        ConfigError, match=r"actor\.model\.model_path: no policy weights at .*actor/model\.pt"
    ):
        app.load_config(path, [f"actor.model.model_path={tmp_path / 'global_step_9'}"])
    weights = tmp_path / "global_step_9" / "actor" / "model.pt"
    weights.parent.mkdir(parents=True)
    weights.touch()  # only its presence is checked at config load
    assert app.load_config(path, [f"actor.model.model_path={weights.parent.parent}"]).actor.model.model_path


def test_a_checkpoint_check_ignores_where_the_initial_weights_came_from(
    app: EmbodiedApp, tmp_path: Path
) -> None:
    import json

    from rlinf_core.config import unstructure_config

    path = APP_DIR / "config" / "cartpole_ppo.yaml"
    weights = tmp_path / "sft" / "model.pt"
    weights.parent.mkdir()
    weights.touch()
    started = app.load_config(path, [f"actor.model.model_path={weights}"])
    checkpoint = tmp_path / "global_step_2"
    checkpoint.mkdir()
    meta = {"global_step": 2, "config": unstructure_config(started)}
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    app.check_checkpoint(app.load_config(path), checkpoint)  # no model_path now: same shapes
    with pytest.raises(ConfigError, match=r"actor\.model: the checkpoint"):
        app.check_checkpoint(app.load_config(path, ["actor.model.hidden_sizes=[8]"]), checkpoint)


def test_realworld_env_placement_is_checked_at_load(app: EmbodiedApp) -> None:
    """A realworld env drives one robot per env from the robots' node group; mistakes are named before Ray."""
    config = APP_DIR / "config" / "realworld_dummy_franka_sac_cnn.yaml"
    # Real robots (no dummy) with the env on the simulated slot: no robot node group to drive.
    with pytest.raises(ConfigError) as err:
        app.load_config(
            config,
            [
                'cluster.component_placement={"actor,env,rollout": 0}',
                "env.train.env_kwargs.is_dummy=false",
                "env.eval.env_kwargs.is_dummy=false",
            ],
        )
    text = str(err.value)
    assert "env.train.env_type 'realworld' drives robots" in text and "env.eval.env_type" in text, text
    assert "cluster.node_groups[].hardware" in text, text
    # Two envs for the one Franka the env worker holds.
    with pytest.raises(
        ConfigError, match=r"env\.train\.total_num_envs \(2\) must give each env rank one env per robot"
    ):
        app.load_config(config, ["env.train.total_num_envs=2"])
    # Dummies without a robot node group are fine: each env starts its own dummy robot.
    app.load_config(config, ['cluster.component_placement={"actor,env,rollout": 0}'])
    # RLinf's node-group shape loads as written: node_ranks as an int or a range text, hardware: {type, configs}.
    cfg = app.load_config(
        config,
        [
            "cluster.node_groups=[{label: franka, node_ranks: '0-0', hardware: {type: Franka, configs: [{node_rank: 0, robot_ip: 10.0.0.2}]}}]"
        ],
    )
    (group,) = cfg.cluster.node_groups
    assert (group.node_ranks, group.hardware_type, group.hardware_configs[0]["robot_ip"]) == (
        (0,),
        "Franka",
        "10.0.0.2",
    )
    with pytest.raises(ConfigError, match=r"cluster\.node_groups: .*unknown hardware key\(s\) \['ip'\]"):
        app.load_config(
            config, ["cluster.node_groups=[{label: franka, node_ranks: 0, hardware: {type: Franka, ip: 1}}]"]
        )


def test_dynamic_scaling_is_refused_by_the_embodied_app(app: EmbodiedApp) -> None:
    with pytest.raises(ConfigError, match=r"runner\.dynamic_scaling: only the reasoning and agent apps"):
        app.load_config(APP_DIR / "config" / "cartpole_ppo.yaml", ["runner.dynamic_scaling=true"])


def test_the_reasoning_pipeline_switch_is_refused_by_the_embodied_app(app: EmbodiedApp) -> None:
    with pytest.raises(
        ConfigError, match=r"runner\.pipeline / runner\.pipeline_chunk_prompts belong to the reasoning"
    ):
        app.load_config(APP_DIR / "config" / "cartpole_ppo.yaml", ["runner.pipeline=true"])
