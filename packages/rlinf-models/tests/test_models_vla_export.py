"""A VLA policy after SFT steps exports itself (``save_pretrained``) in its adapter's published layout.

For each adapter (π0, SmolVLA, GR00T N1.5, OpenVLA, OpenVLA-OFT): take a few ``imitation_loss`` steps on a tiny
checkpoint, export, reload the export with the adapter's own strict loader and through ``build_policy`` (as
``model_path`` directly and as the ``global_step_<N>`` directory holding it in ``pretrained/``): the reloaded
policy's deterministic actions and values are the trained policy's.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from rlinf_models.gr00t import load_gr00t
from rlinf_models.gr00t.testing import make_tiny_gr00t
from rlinf_models.openvla import load_openvla
from rlinf_models.openvla._oft import load_openvla_oft
from rlinf_models.openvla.testing import make_tiny_openvla, make_tiny_openvla_oft
from rlinf_models.pi0 import load_pi0
from rlinf_models.pi0.testing import make_tiny_pi0, write_char_tokenizer
from rlinf_models.policies import PRETRAINED_SUBDIR, PolicyConfig, build_policy, vla_checkpoint_directory
from rlinf_models.smolvla import load_smolvla
from rlinf_models.smolvla.testing import make_tiny_smolvla
from rlinf_models.vla import plain_state_dict
from rlinf_models.vla.testing import libero_obs, libero_spec

torch.set_num_threads(1)

TASKS = ("pick up the red block", "put the bowl on the plate")
SPEC = libero_spec(64, TASKS)
N = 4


def _obs(n: int = N, seed: int = 0) -> dict[str, torch.Tensor]:
    return libero_obs(n, 64, seed)


def _flow_config(model_type: str, paths: dict[str, Path], **changes: Any) -> PolicyConfig:
    keys = {k: str(v) for k, v in paths.items()}
    base: dict[str, Any] = {
        "model_type": model_type,
        "image_keys": ("rgb", "wrist_rgb"),
        "num_action_chunks": 3,
        "denoising_steps": 3,
        "add_value_head": True,
    }
    return PolicyConfig(**{**base, **keys, **changes})


def _pi0(root: Path) -> PolicyConfig:
    return _flow_config("pi0", make_tiny_pi0(root))


def _smolvla(root: Path) -> PolicyConfig:
    return _flow_config("smolvla", make_tiny_smolvla(root))


def _gr00t(root: Path) -> PolicyConfig:
    paths = make_tiny_gr00t(root)
    # Eagle's prompt ids must stay below the image token: a tokenizer of the instructions' characters only.
    write_char_tokenizer(paths["tokenizer_path"], string.ascii_lowercase + " <>[]'/0123456789")
    return _flow_config("gr00t", paths)


def _openvla(root: Path) -> PolicyConfig:
    ckpt = make_tiny_openvla(root / "ckpt", value_head_sizes=(16,))
    return PolicyConfig(model_type="openvla", model_path=str(ckpt), add_value_head=True)


def _openvla_oft(root: Path) -> PolicyConfig:
    ckpt = make_tiny_openvla_oft(root / "ckpt", value_head_sizes=(16,))
    return PolicyConfig(
        model_type="openvla_oft",
        model_path=str(ckpt),
        num_action_chunks=8,
        unnorm_key="libero_spatial_no_noops",
        image_keys=("rgb", "wrist_rgb"),
        add_value_head=True,
    )


def _load_openvla_oft(directory: Path) -> torch.nn.Module:
    return load_openvla_oft(directory, action_dim=7, num_action_chunks=8, num_images=2)[0]


# model_type -> (the tiny checkpoint's config, the adapter's loader of a directory, the exported statistics)
ADAPTERS: dict[str, tuple[Callable[[Path], PolicyConfig], Callable[[Path], Any], str | None]] = {
    "pi0": (_pi0, lambda d: load_pi0(d)[0], "norm_stats.json"),
    "smolvla": (_smolvla, lambda d: load_smolvla(d)[0], "norm_stats.safetensors"),
    "gr00t": (_gr00t, lambda d: load_gr00t(d, embodiment_id=31)[0], None),
    "openvla": (_openvla, lambda d: load_openvla(d)[0], None),
    "openvla_oft": (_openvla_oft, _load_openvla_oft, None),
}


def _sft(policy: Any, steps: int = 3) -> None:
    """A few imitation steps on random demonstrations (what the SFT runner does)."""
    torch.manual_seed(0)
    chunks = policy.config.num_action_chunks
    optim = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    obs, actions, mask = _obs(), torch.rand(N, chunks, 7) * 2 - 1, torch.ones(N, chunks)
    policy.train()
    for _ in range(steps):
        loss = policy.imitation_loss(obs, actions, mask)
        optim.zero_grad()
        loss.backward()
        optim.step()
    policy.eval()


def _exported_config(config: PolicyConfig, model_path: Path, stats: str | None) -> PolicyConfig:
    """``config`` reading the export: its tokenizer and statistics copies too (null where the layout holds them)."""
    export = vla_checkpoint_directory(model_path)
    changes: dict[str, Any] = {"model_path": str(model_path)}
    if config.model_type in ("openvla", "openvla_oft"):
        changes["tokenizer_path"] = None
    else:
        changes["tokenizer_path"] = str(export / "tokenizer")
        changes["norm_stats_path"] = None if stats is None else str(export / stats)
    return attrs.evolve(config, **changes)


@pytest.mark.parametrize("model_type", sorted(ADAPTERS))
def test_an_sft_policy_exports_and_reloads_with_the_same_actions(model_type: str, tmp_path: Path) -> None:
    make, load, stats = ADAPTERS[model_type]
    config = make(tmp_path / "tiny")
    torch.manual_seed(0)
    policy: Any = build_policy(SPEC, config)
    obs = _obs(seed=1)
    before = policy.act(obs, deterministic=True).actions
    _sft(policy)
    trained = policy.act(obs, deterministic=True)
    assert not torch.allclose(trained.actions, before), "the SFT steps changed nothing"

    step = tmp_path / "checkpoints" / "global_step_3"
    export = policy.save_pretrained(step / PRETRAINED_SUBDIR)
    # The adapter's own loader reads the export strictly (missing / unexpected tensors raise).
    model = load(export)
    want = plain_state_dict(policy.model)
    got = model.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, msg=name)
    # Through build_policy: the export itself, and the global_step_<N> directory holding it.
    for model_path in (export, step):
        reloaded = build_policy(SPEC, _exported_config(config, model_path, stats))
        reloaded.eval()
        assert Path(reloaded.config.model_path or "") == export
        again = reloaded.act(obs, deterministic=True)
        torch.testing.assert_close(again.actions, trained.actions, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(again.values, trained.values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", sorted(ADAPTERS))
def test_a_lora_sft_policy_exports_merged_weights(model_type: str, tmp_path: Path) -> None:
    make, load, stats = ADAPTERS[model_type]
    config = attrs.evolve(make(tmp_path / "tiny"), is_lora=True, lora_rank=4, lora_alpha=8.0)
    policy: Any = build_policy(SPEC, config)
    _sft(policy)
    assert any(".lora_B." in n and float(p.detach().abs().sum()) > 0 for n, p in policy.named_parameters())
    export = policy.save_pretrained(tmp_path / "export")
    model = load(export)  # strict: a plain model, no adapter entries in the files
    assert not any(".lora_" in name or ".base_layer." in name for name in model.state_dict())
    plain = build_policy(SPEC, attrs.evolve(_exported_config(config, export, stats), is_lora=False))
    obs = _obs(seed=2)
    torch.testing.assert_close(
        plain.act(obs, deterministic=True).actions,
        policy.act(obs, deterministic=True).actions,
        atol=1e-4,
        rtol=1e-4,
    )


def test_a_model_path_of_neither_layout_is_refused_naming_the_key(tmp_path: Path) -> None:
    config = _pi0(tmp_path / "tiny")
    rl_checkpoint = tmp_path / "global_step_2"
    (rl_checkpoint / "actor").mkdir(parents=True)
    torch.save({}, rl_checkpoint / "actor" / "model.pt")
    with pytest.raises(FileNotFoundError, match=r"actor\.model\.model_path: .* no pretrained/ export"):
        build_policy(SPEC, attrs.evolve(config, model_path=str(rl_checkpoint)))
    with pytest.raises(FileNotFoundError, match=r"actor\.model\.model_path: .* neither a VLA checkpoint"):
        build_policy(SPEC, attrs.evolve(config, model_path=str(tmp_path)))
