"""Regenerate ``lerobot_gr00t_head_tiny/`` with LeRobot's own GR00T N1.5 action head (not a test).

LeRobot cannot join RLinf's lock (it pins old torch/transformers), so this runs in a throwaway environment
with ``lerobot==0.4.4`` (its ``groot`` policy: ``action_head/flow_matching_action_head.py`` on diffusers), e.g.::

    uv venv -p 3.11 /tmp/lerobot-venv && VIRTUAL_ENV=/tmp/lerobot-venv uv pip install "lerobot==0.4.4" diffusers
    /tmp/lerobot-venv/bin/python make_lerobot_gr00t_reference.py .

Only the action head is LeRobot's here: its Eagle backbone needs transformers (absent from that environment:
lerobot 0.4.4 installs without it) and NVIDIA's Eagle config and processor files from the Hub, which cannot be
downloaded here. Without transformers, LeRobot's head module falls back to ``object`` for ``PretrainedConfig``
and ``None`` for ``BatchFeature``: the config is filled attribute by attribute and ``BatchFeature`` is replaced
by the dict with attribute access that transformers' is. The head is built from a tiny ``FlowmatchingActionHeadConfig`` of
the published structure (ada-norm DiT with interleaved self-attention, a VL self-attention transformer,
category-specific MLPs), every parameter filled with random values, and run in eval mode. The directory gets:

- ``head.safetensors``: the head's ``state_dict`` under the published ``action_head.`` prefix;
- ``reference.safetensors``: fixed VL features, state, actions, embodiment ids, the training noise and time,
  and LeRobot's outputs: the predicted velocity on the training input, the loss, the initial sampling noise and
  ``get_action``'s actions.
"""

import json
import sys
from pathlib import Path

import torch
from lerobot.policies.groot.action_head import flow_matching_action_head as fm
from safetensors.torch import save_file

HEAD = {  # the same sizes as rlinf_models.gr00t.testing.TINY_GR00T's head
    "action_dim": 8,
    "action_horizon": 8,
    "add_pos_embed": True,
    "backbone_embedding_dim": 32,
    "diffusion_model_cfg": {
        "attention_head_dim": 8,
        "cross_attention_dim": 32,
        "dropout": 0.2,
        "final_dropout": True,
        "interleave_self_attention": True,
        "norm_type": "ada_norm",
        "num_attention_heads": 4,
        "num_layers": 2,
        "output_dim": 24,
        "positional_embeddings": None,
    },
    "hidden_size": 24,
    "input_embedding_dim": 32,
    "max_action_dim": 8,
    "max_state_dim": 8,
    "max_num_embodiments": 32,
    "max_seq_len": 16,
    "noise_beta_alpha": 1.5,
    "noise_beta_beta": 1.0,
    "noise_s": 0.999,
    "num_inference_timesteps": 4,
    "num_target_vision_tokens": 4,
    "num_timestep_buckets": 1000,
    "tune_diffusion_model": True,
    "tune_projector": True,
    "use_vlln": True,
    "vl_self_attention_cfg": {
        "attention_head_dim": 8,
        "dropout": 0.2,
        "final_dropout": True,
        "num_attention_heads": 4,
        "num_layers": 1,
        "positional_embeddings": None,
    },
}
BATCH, VL_TOKENS = 2, 6


class _BatchFeature(dict):  # transformers' BatchFeature: a dict whose keys are also attributes
    def __init__(self, data: dict) -> None:
        super().__init__(data)

    def __getattr__(self, name: str) -> torch.Tensor:
        return self[name]


def _config() -> "fm.FlowmatchingActionHeadConfig":
    config = object.__new__(fm.FlowmatchingActionHeadConfig)
    for key, value in json.loads(json.dumps(HEAD)).items():
        setattr(config, key, value)
    return config


def main(root: Path) -> None:
    if fm.BatchFeature is None:
        fm.BatchFeature = _BatchFeature
    torch.manual_seed(0)
    head = fm.FlowmatchingActionHead(_config())
    with torch.no_grad():
        for param in head.parameters():
            param.add_(0.1 * torch.randn(param.shape))
    head.eval()
    g = torch.Generator().manual_seed(1)
    vl = torch.randn(BATCH, VL_TOKENS, 32, generator=g)
    state = torch.randn(BATCH, 1, 8, generator=g)
    actions = torch.rand(BATCH, 8, 8, generator=g) * 2 - 1
    ids = torch.tensor([31, 5])
    noise = torch.randn(BATCH, 8, 8, generator=g)
    tau = torch.tensor([0.3, 0.8125])  # GR00T's time (0: noise, 1: actions)
    init = torch.randn(BATCH, 8, 8, generator=g)

    real_randn = torch.randn
    captured: dict[str, torch.Tensor] = {}
    head.action_decoder.register_forward_hook(lambda _m, _i, out: captured.__setitem__("pred", out))

    def fixed(tensor: torch.Tensor):  # a stand-in for torch.randn
        return lambda *_a, **_k: tensor.clone()

    def features() -> fm.BatchFeature:
        return fm.BatchFeature(
            data={"backbone_features": vl.clone(), "backbone_attention_mask": torch.ones(BATCH, VL_TOKENS)}
        )

    try:
        fm.torch.randn = fixed(noise)
        head.sample_time = lambda *_a, **_k: tau.clone()
        action_input = fm.BatchFeature(
            data={
                "state": state,
                "action": actions,
                "embodiment_id": ids,
                "action_mask": torch.ones_like(actions),
            }
        )
        with torch.no_grad():
            loss = head(features(), action_input)["loss"]
        velocity = captured["pred"][:, -8:].clone()
        fm.torch.randn = fixed(init)
        sampled = head.get_action(features(), fm.BatchFeature(data={"state": state, "embodiment_id": ids}))
    finally:
        fm.torch.randn = real_randn
    out = root / "lerobot_gr00t_head_tiny"
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {f"action_head.{k}": v.contiguous() for k, v in head.state_dict().items()},
        str(out / "head.safetensors"),
    )
    reference = {
        "vl": vl,
        "state": state[:, 0],
        "actions": actions,
        "embodiment_id": ids,
        "noise": noise,
        "tau": tau,
        "velocity": velocity,
        "loss": loss.reshape(1),
        "init": init,
        "sampled": sampled["action_pred"],
    }
    save_file({k: v.contiguous() for k, v in reference.items()}, str(out / "reference.safetensors"))
    (out / "head_config.json").write_text(json.dumps(HEAD, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
