"""Qwen2.5-VL on the LLM path: the tiny checkpoint, prompts with images, actor vs rollout log-probs, training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("PIL")

from PIL import Image
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import ImagePromptEncoder, PromptExample, pack_images, pack_sequences, unpack_images
from rlinf_models import OptimConfig
from rlinf_models.llm import LLMActorConfig, LLMModelConfig, load_causal_lm, load_tokenizer
from rlinf_models.llm._vlm import (
    IMAGE_PAD,
    VLMPolicy,
    VLMPromptEncoder,
    decode_image,
    is_vision_language,
    load_image_processor,
    vision_inputs,
)
from rlinf_models.llm.testing import local_llm_actor, make_tiny_model_dir, make_tiny_vlm_dir
from rlinf_rollout.llm import SamplingConfig
from rlinf_rollout.llm._hf import HFGenerateEngine
from transformers import AutoImageProcessor, AutoModelForImageTextToText, Qwen2_5_VLForConditionalGeneration

torch.set_num_threads(1)

GRPO = AlgorithmConfig(adv_type="grpo", loss_type="actor", update_epoch=1, group_size=2)


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_vlm_dir(tmp_path_factory.mktemp("tiny_vlm") / "m")


@pytest.fixture(scope="module")
def image_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for k, (h, w) in enumerate([(112, 112), (60, 90), (84, 56)]):
        path = root / f"img{k}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def encoder(vlm_dir: Path) -> VLMPromptEncoder:
    cfg = LLMModelConfig(model_path=str(vlm_dir))
    return VLMPromptEncoder(load_tokenizer(cfg), load_image_processor(cfg))


def example(images: list[str], text: str = "How many shapes?") -> PromptExample:
    return PromptExample(messages=({"role": "user", "content": text},), answers=("3",), images=tuple(images))


def test_tiny_vlm_loads_like_a_real_checkpoint(vlm_dir: Path) -> None:
    assert is_vision_language(vlm_dir)
    model = load_causal_lm(LLMModelConfig(model_path=str(vlm_dir)))
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration)
    # The plain from_pretrained path a real checkpoint takes.
    assert isinstance(
        AutoModelForImageTextToText.from_pretrained(vlm_dir), Qwen2_5_VLForConditionalGeneration
    )
    processor = AutoImageProcessor.from_pretrained(vlm_dir)
    assert (processor.patch_size, processor.merge_size) == (14, 2)
    tokenizer = load_tokenizer(LLMModelConfig(model_path=str(vlm_dir)))
    for token in ("<|vision_start|>", IMAGE_PAD, "<|vision_end|>"):
        assert tokenizer.convert_tokens_to_ids(token) is not None
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    assert tokenizer.convert_tokens_to_ids(IMAGE_PAD) == model.config.image_token_id


def test_encoder_expands_each_image_as_the_processor_grids_it(vlm_dir: Path, image_files: list[str]) -> None:
    enc = encoder(vlm_dir)
    assert isinstance(enc, ImagePromptEncoder)
    ex = example(image_files[:2], "Compare <image> and <image>: which has more?")
    ids = enc.encode_prompt(ex)
    images = enc.prompt_images(ex)
    grid = enc.image_processor(images=images, return_tensors="pt")["image_grid_thw"]
    per_image = (grid.prod(-1) // 4).tolist()
    pad = enc.image_pad_id
    runs: list[int] = []
    for i, tok in enumerate(ids):
        if tok == pad:
            if i and ids[i - 1] == pad:
                runs[-1] += 1
            else:
                runs.append(1)
    assert runs == per_image  # 112x112 -> 8x8 patches -> 16; 60x90 -> 56x84 -> 4x6 -> 6
    text = enc.tokenizer.decode(ids)
    assert (
        text.index("Compare")
        < text.index("<|vision_start|>")
        < text.index("and")
        < text.rindex("<|vision_start|>")
    )
    # The ids transformers' Qwen2.5-VL processor builds: each pad of the rendered text repeated grid / merge**2
    # times, the whole string tokenized at once.
    pieces = enc.prompt_text(ex).split(IMAGE_PAD)
    expanded = pieces[0] + "".join(IMAGE_PAD * n + p for n, p in zip(per_image, pieces[1:], strict=True))
    assert enc.tokenizer(expanded, add_special_tokens=False)["input_ids"] == ids


def test_encoder_matches_transformers_processor(vlm_dir: Path, image_files: list[str]) -> None:
    pytest.importorskip("torchvision")  # Qwen2_5_VLProcessor builds a video processor, which needs it
    from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor

    enc = encoder(vlm_dir)
    ex = example(image_files[:2], "Compare <image> and <image>: which has more?")
    processor = Qwen2_5_VLProcessor(
        image_processor=enc.image_processor, tokenizer=enc.tokenizer, video_processor=Qwen2VLVideoProcessor()
    )
    ref = processor(text=[enc.prompt_text(ex)], images=enc.prompt_images(ex), return_tensors="pt")
    assert ref["input_ids"][0].tolist() == enc.encode_prompt(ex)


def test_encoder_images_first_without_markers_and_rejects_a_wrong_marker_count(
    vlm_dir: Path, image_files: list[str]
) -> None:
    enc = encoder(vlm_dir)
    text = enc.tokenizer.decode(enc.encode_prompt(example(image_files[:1])))
    assert text.index("<|vision_end|>") < text.index("How many")
    with pytest.raises(ValueError, match="1 <image> markers for 2 images"):
        enc.encode_prompt(example(image_files[:2], "only <image> one"))


def test_decode_image_reads_paths_and_data_uris(image_files: list[str]) -> None:
    import base64

    pixels = decode_image(image_files[1])
    assert pixels.shape == (60, 90, 3) and pixels.dtype == np.uint8
    uri = "data:image/png;base64," + base64.b64encode(Path(image_files[1]).read_bytes()).decode()
    assert np.array_equal(decode_image(uri), pixels)


def test_pack_images_round_trip(image_files: list[str]) -> None:
    rows = [[decode_image(image_files[0]), decode_image(image_files[1])], [], [decode_image(image_files[2])]]
    packed = pack_images(rows)
    assert packed["images"].shape == (3, 2, 112, 112, 3)
    assert packed["image_sizes"].tolist() == [[[112, 112], [60, 90]], [[0, 0], [0, 0]], [[84, 56], [0, 0]]]
    back = unpack_images(packed["images"], packed["image_sizes"])
    assert [len(r) for r in back] == [2, 0, 1]
    assert all(
        np.array_equal(a, b) for r, s in zip(rows, back, strict=True) for a, b in zip(r, s, strict=True)
    )


def actor_cfg(vlm_dir: Path, **kwargs: Any) -> LLMActorConfig:
    defaults: dict[str, Any] = {
        "optim": OptimConfig(lr=1e-2, clip_grad=1.0),
        "global_batch_size": 4,
        "micro_batch_size": 2,
        "seed": 3,
        "temperature": 1.0,
    }
    defaults.update(kwargs)
    return LLMActorConfig(model=LLMModelConfig(model_path=str(vlm_dir)), **defaults)


def rollout_batch(vlm_dir: Path, image_files: list[str], seed: int = 0) -> tuple[dict[str, Any], list[Any]]:
    """Four sampled responses (two prompts with images, one without) packed as the reasoning runner packs them."""
    enc = encoder(vlm_dir)
    examples = [example(image_files[:1]), example(image_files[1:3], "<image> or <image>?"), example([])]
    examples.append(examples[0])
    prompts = [enc.encode_prompt(e) for e in examples]
    images = [enc.prompt_images(e) for e in examples]
    engine = HFGenerateEngine(LLMModelConfig(model_path=str(vlm_dir)), max_batch_size=3, device="cpu")
    outs = engine.generate(
        prompts, SamplingConfig(temperature=1.0, max_new_tokens=8, seed=seed), images=images
    )
    batch: dict[str, Any] = pack_sequences(
        prompts, [o.token_ids for o in outs], pad_token_id=enc.pad_token_id
    )
    batch.update(pack_images(images))
    p_len = batch["input_ids"].shape[1] - int(batch["response_lengths"].max())
    rollout = np.zeros(batch["input_ids"].shape, dtype=np.float32)
    for i, o in enumerate(outs):
        rollout[i, p_len : p_len + len(o.logprobs)] = o.logprobs
    batch["rollout_logprobs"] = rollout
    return {k: torch.from_numpy(v) for k, v in batch.items()}, outs


def test_actor_logprobs_equal_rollout_logprobs(vlm_dir: Path, image_files: list[str]) -> None:
    batch, outs = rollout_batch(vlm_dir, image_files)
    assert all(len(o.token_ids) for o in outs)
    actor = local_llm_actor(actor_cfg(vlm_dir), GRPO)
    assert isinstance(actor.backend.policy, VLMPolicy)
    logprobs = actor.compute_logprobs(batch)["logprobs"]
    mask = batch["loss_mask"].bool()
    diff = (logprobs - batch["rollout_logprobs"]).abs()[mask]
    assert float(diff.max()) <= 1e-5, float(diff.max())
    # The images matter: scoring the same tokens without them changes the log-probs.
    blank = dict(batch, images=torch.zeros_like(batch["images"]))
    assert float((actor.compute_logprobs(blank)["logprobs"] - logprobs).abs()[mask].max()) > 1e-4


def test_grpo_step_trains_vision_tower_and_language_model(vlm_dir: Path, image_files: list[str]) -> None:
    batch, _ = rollout_batch(vlm_dir, image_files, seed=1)
    batch["advantages"] = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None] * batch["loss_mask"].float()
    actor = local_llm_actor(actor_cfg(vlm_dir), GRPO)
    before = {k: v.detach().clone() for k, v in actor.backend.policy.state_dict().items()}
    metrics = actor.run_training(batch)
    assert metrics["actor/num_optimizer_steps"] == 1.0 and np.isfinite(metrics["actor/grad_norm"])
    after = actor.backend.policy.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(".visual.blocks.0." in k for k in changed) and any(".visual.merger." in k for k in changed)
    assert any(".language_model.layers.0." in k for k in changed)
    # Against the rollout's log-probs (the behaviour policy) the update starts on-policy.
    assert metrics["actor/rollout_logprob_diff"] <= 1e-5
    sft = {k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask", "images", "image_sizes")}
    assert np.isfinite(actor.run_sft(sft)["sft/loss"])


def test_weights_synced_to_the_rollout_score_like_the_actor(vlm_dir: Path, image_files: list[str]) -> None:
    batch, _ = rollout_batch(vlm_dir, image_files, seed=2)
    batch["advantages"] = torch.tensor([1.0, -1.0, -1.0, 1.0])[:, None] * batch["loss_mask"].float()
    actor = local_llm_actor(actor_cfg(vlm_dir), GRPO)
    actor.run_training(batch)
    state = actor.backend.export_hf_state_dict()
    engine = HFGenerateEngine(LLMModelConfig(model_path=str(vlm_dir)), max_batch_size=4, device="cpu")
    engine.update_weights(state)
    enc = encoder(vlm_dir)
    ex = example(image_files[:1])
    out = engine.generate(
        [enc.encode_prompt(ex)],
        SamplingConfig(temperature=1.0, max_new_tokens=6, seed=0),
        images=[enc.prompt_images(ex)],
    )[0]
    b = pack_sequences([enc.encode_prompt(ex)], [out.token_ids], pad_token_id=enc.pad_token_id)
    b.update(pack_images([enc.prompt_images(ex)]))
    scored = actor.compute_logprobs({k: torch.from_numpy(v) for k, v in b.items()})["logprobs"][0]
    p_len = len(enc.encode_prompt(ex))
    assert torch.allclose(scored[p_len : p_len + len(out.logprobs)], torch.tensor(out.logprobs), atol=1e-5)


def test_a_sampled_image_pad_in_the_response_is_an_ordinary_token(
    vlm_dir: Path, image_files: list[str]
) -> None:
    """A random policy may sample <|image_pad|>: generate embedded it as text, so must the actor."""
    cfg = LLMModelConfig(model_path=str(vlm_dir))
    enc = encoder(vlm_dir)
    ex = example(image_files[:1])
    prompt, images = enc.encode_prompt(ex), enc.prompt_images(ex)
    policy = VLMPolicy(load_causal_lm(cfg), load_image_processor(cfg))
    response = [5, enc.image_pad_id, 7]
    b = pack_sequences([prompt], [response], pad_token_id=enc.pad_token_id)
    b.update(pack_images([images]))
    t = {k: torch.from_numpy(v) for k, v in b.items()}
    with torch.no_grad():
        out = policy(
            t["input_ids"],
            t["attention_mask"],
            vision={"images": t["images"], "image_sizes": t["image_sizes"]},
        )
    # Reference: transformers' model fed the prompt with its images, then the response tokens one by one.
    model: Any = policy.model
    inputs = vision_inputs(t["images"], t["image_sizes"], policy.image_processor)
    assert inputs is not None
    ids = torch.tensor([prompt])
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=inputs["pixel_values"],
            image_grid_thw=inputs["image_grid_thw"],
            mm_token_type_ids=(ids == enc.image_pad_id).int(),
            max_new_tokens=3,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            prefix_allowed_tokens_fn=lambda _b, sent: [response[sent.shape[0] - len(prompt)]],
        )
    assert ref.sequences[0, len(prompt) :].tolist() == response
    for k, tok in enumerate(response):
        expected = torch.log_softmax(ref.logits[k][0].float(), -1)[tok]
        assert torch.allclose(out["logprobs"][0, len(prompt) + k], expected, atol=1e-5)


def test_text_model_refuses_images(tmp_path: Path, image_files: list[str]) -> None:
    text_dir = make_tiny_model_dir(tmp_path / "text")
    assert not is_vision_language(text_dir)
    engine = HFGenerateEngine(LLMModelConfig(model_path=str(text_dir)), max_batch_size=2, device="cpu")
    with pytest.raises(ValueError, match="text-only model"):
        engine.generate([[5, 6]], SamplingConfig(max_new_tokens=2), images=[[decode_image(image_files[0])]])
