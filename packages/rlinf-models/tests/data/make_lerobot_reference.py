"""Regenerate ``lerobot_pi0_tiny/`` and ``lerobot_pi05_tiny/`` with LeRobot's own π0 / π0.5 (not a test).

LeRobot cannot join RLinf's lock (it pins torch<2.12, transformers<5.6, Python>=3.12), so this runs in a
throwaway environment, e.g.::

    uv venv -p 3.12 /tmp/lr && VIRTUAL_ENV=/tmp/lr uv pip install "lerobot[pi]==0.6.1" "torch==2.10.0"
    /tmp/lr/bin/python make_lerobot_reference.py .

For each variant it builds LeRobot's ``PI0Policy`` / ``PI05Policy`` with tiny widths (LeRobot only knows the
published sizes, so its size table and the two transformers constructors are patched), fills every parameter
with random values, and writes into ``lerobot_<variant>_tiny/``:

- ``ckpt/``: ``PI0Policy.save_pretrained`` (``config.json`` + ``model.safetensors``, LeRobot's layout), plus
  the ``rlinf_architecture`` entry that records the tiny sizes, and LeRobot's normalizer statistics file;
- ``reference.safetensors``: fixed inputs and LeRobot's per-element training loss and sampled actions;
- ``normalized.safetensors``: raw state/action and LeRobot's normalisation of them (mean/std for π0,
  quantiles for π0.5);
- π0.5 only, ``prompts.json``: LeRobot's prompt (instruction + discretised state) for a normalised state.
"""

import json
import sys
from pathlib import Path

import torch
from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
from lerobot.lerobot_types import TransitionKey
from lerobot.policies.pi0 import modeling_pi0
from lerobot.policies.pi0.configuration_pi0 import PI0Config
from lerobot.policies.pi0.modeling_pi0 import PI0Policy
from lerobot.policies.pi05 import modeling_pi05
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.policies.pi05.modeling_pi05 import PI05Policy
from lerobot.policies.pi05.processor_pi05 import Pi05PrepareStateTokenizerProcessorStep
from lerobot.processor import NormalizerProcessorStep
from safetensors.torch import save_file

VLM = {"width": 32, "depth": 2, "mlp_dim": 64, "num_heads": 8, "num_kv_heads": 1, "head_dim": 4}
EXPERT = {"width": 16, "depth": 2, "mlp_dim": 32, "num_heads": 8, "num_kv_heads": 1, "head_dim": 4}
VISION = {"hidden_size": 24, "intermediate_size": 40, "num_layers": 2, "num_heads": 2, "patch_size": 8}
VOCAB = 64


def _tiny_gemma(variant: str) -> modeling_pi0.GemmaConfig:
    return modeling_pi0.GemmaConfig(**(VLM if variant == "gemma_2b" else EXPERT))


class _TinyPaliGemma(modeling_pi0.PaliGemmaForConditionalGenerationWithPiGemma):  # same class in pi05
    def __init__(self, config):
        config.text_config.vocab_size = VOCAB
        config.image_token_index = VOCAB
        vision = config.vision_config
        vision.hidden_size = VISION["hidden_size"]
        vision.intermediate_size = VISION["intermediate_size"]
        vision.num_hidden_layers = VISION["num_layers"]
        vision.num_attention_heads = VISION["num_heads"]
        vision.patch_size = VISION["patch_size"]
        vision.projection_dim = VLM["width"]
        config.projection_dim = VLM["width"]
        super().__init__(config)


class _TinyExpert(modeling_pi0.PiGemmaForCausalLM):
    def __init__(self, config):
        config.vocab_size = VOCAB
        super().__init__(config)


def main(root: Path) -> None:
    for module in (modeling_pi0, modeling_pi05):
        module.get_gemma_config = _tiny_gemma
        module.PaliGemmaForConditionalGenerationWithPiGemma = _TinyPaliGemma
        module.PiGemmaForCausalLM = _TinyExpert
    for variant in ("pi0", "pi05"):
        out = root / f"lerobot_{variant}_tiny"
        out.mkdir(exist_ok=True)
        _write(out, pi05=variant == "pi05")


def _write(out: Path, *, pi05: bool) -> None:
    torch.manual_seed(0)
    visual = PolicyFeature(FeatureType.VISUAL, (3, 16, 16))
    config = (PI05Config if pi05 else PI0Config)(
        chunk_size=4,
        n_action_steps=4,
        max_state_dim=8,
        max_action_dim=8,
        image_resolution=(16, 16),
        tokenizer_max_length=6,
        num_inference_steps=3,
        device="cpu",
        dtype="float32",
        input_features={
            "observation.images.base": visual,
            "observation.images.wrist": visual,
            "observation.state": PolicyFeature(FeatureType.STATE, (5,)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (7,))},
    )
    policy = (PI05Policy if pi05 else PI0Policy)(config)
    with torch.no_grad():  # random everything, norms included, so that no tensor goes unchecked
        for param in policy.parameters():
            param.copy_(torch.randn_like(param) * 0.2)
    policy.eval()
    ckpt = out / "ckpt"
    policy.save_pretrained(ckpt)
    data = json.loads((ckpt / "config.json").read_text())
    data["rlinf_architecture"] = {
        "paligemma": VLM,
        "action_expert": EXPERT,
        "vision": VISION,
        "vocab_size": VOCAB,
    }
    (ckpt / "config.json").write_text(json.dumps(data, indent=4) + "\n")

    g = torch.Generator().manual_seed(1)
    images = torch.rand(2, 2, 3, 16, 16, generator=g) * 2 - 1  # [B, camera, 3, H, W] in [-1, 1]
    image_masks = torch.tensor([[True, True], [True, False]])  # the second sample lacks its wrist camera
    tokens = torch.randint(0, VOCAB, (2, 6), generator=g)
    token_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    state, actions = torch.randn(2, 8, generator=g), torch.randn(2, 4, 8, generator=g)
    noise, time = torch.randn(2, 4, 8, generator=g), torch.tensor([0.3, 0.9])
    cams, masks = list(images.unbind(1)), list(image_masks.unbind(1))
    model = policy.model
    with torch.no_grad():
        if pi05:  # the state is part of the prompt
            losses = model.forward(cams, masks, tokens, token_mask, actions, noise, time)
            sampled = model.sample_actions(cams, masks, tokens, token_mask, noise=noise, num_steps=3)
        else:
            losses = model.forward(cams, masks, tokens, token_mask, state, actions, noise, time)
            sampled = model.sample_actions(cams, masks, tokens, token_mask, state, noise=noise, num_steps=3)
    save_file(
        {
            "images": images,
            "image_masks": image_masks,
            "tokens": tokens,
            "token_mask": token_mask,
            "state": state,
            "actions": actions,
            "noise": noise,
            "time": time,
            "losses": losses,
            "sampled": sampled,
        },
        str(out / "reference.safetensors"),
    )

    gs = torch.Generator().manual_seed(2)
    stats = {}
    for feature, dim in (("observation.state", 5), ("action", 7)):
        q01 = torch.randn(dim, generator=gs) - 1.0
        stats[feature] = {
            "mean": torch.randn(dim, generator=gs),
            "std": torch.rand(dim, generator=gs) + 0.5,
            "q01": q01,
            "q99": q01 + torch.rand(dim, generator=gs) + 1.0,
        }
    mode = NormalizationMode.QUANTILES if pi05 else NormalizationMode.MEAN_STD
    normalizer = NormalizerProcessorStep(
        features={**config.input_features, **config.output_features},
        norm_map={FeatureType.STATE: mode, FeatureType.ACTION: mode},
        stats=stats,
    )
    save_file(
        normalizer.state_dict(), str(ckpt / "policy_preprocessor_step_5_normalizer_processor.safetensors")
    )
    raw_state, raw_action = torch.randn(3, 5, generator=gs), torch.randn(3, 7, generator=gs)
    done = normalizer(
        {TransitionKey.OBSERVATION: {"observation.state": raw_state}, TransitionKey.ACTION: raw_action}
    )
    save_file(
        {
            "raw_state": raw_state,
            "raw_action": raw_action,
            "state": done[TransitionKey.OBSERVATION]["observation.state"],
            "action": done[TransitionKey.ACTION],
        },
        str(out / "normalized.safetensors"),
    )
    if pi05:
        tasks = ["pick_up the\nred block ", "open the drawer"]
        normalized = torch.tensor([[-1.0, -0.999, 0.0, 0.5, 1.0], [-1.5, 0.003, 0.25, 0.9999, 2.0]])
        step = Pi05PrepareStateTokenizerProcessorStep(max_state_dim=8)
        done = step(
            {
                TransitionKey.OBSERVATION: {"observation.state": normalized},
                TransitionKey.COMPLEMENTARY_DATA: {"task": tasks},
            }
        )
        prompts = done[TransitionKey.COMPLEMENTARY_DATA]["task"]
        record = {"tasks": tasks, "state": normalized.tolist(), "prompts": prompts}
        (out / "prompts.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
