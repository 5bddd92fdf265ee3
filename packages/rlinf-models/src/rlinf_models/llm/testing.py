"""Tiny, fully local Hugging Face checkpoints for tests, examples and smoke runs.

:func:`make_tiny_model_dir` writes a complete causal-LM checkpoint directory (``config.json``,
``model.safetensors``, ``generation_config.json`` and tokenizer files with a ChatML chat template) whose
tokenizer is a small byte-level BPE trained on the spot with ``tokenizers`` on a fixed built-in corpus. The
directory loads with ``AutoTokenizer.from_pretrained`` / ``AutoModelForCausalLM.from_pretrained`` exactly
like a real checkpoint, so code under test takes the real-user path (``model_path`` pointing at a local HF
directory) unchanged. Nothing is downloaded.

This module is part of the public API (not test-only), and needs the ``hf`` extra
(``pip install "rlinf-models[hf]"``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

try:
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import (
        AutoModelForCausalLM,
        GenerationConfig,
        LlamaConfig,
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2Config,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.llm.testing needs the Hugging Face stack ({e}): pip install "rlinf-models[hf]"'
    ) from e

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "TOOL_TOKENS",
    "VISION_TOKENS",
    "VLM_CHAT_TEMPLATE",
    "local_llm_actor",
    "make_tiny_model_dir",
    "make_tiny_vlm_dir",
    "random_grpo_batch",
]

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Special tokens of the tiny tokenizer (ids 0, 1, 2); ``<|im_end|>`` is both eos and pad."""

TOOL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Tool-call tags, added as single (non-special) tokens so they survive ``skip_special_tokens``."""

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- 'You may call tools. Tools:\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson + '\\n' }}{%- endfor %}"
    '{{- \'Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>\\n\' }}'
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{%- if message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML (Qwen-style) template; ``tool`` messages are wrapped in ``<tool_response>`` tags."""

VISION_TOKENS: tuple[str, ...] = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
"""Qwen2-VL's vision tokens, added to the tiny VLM's tokenizer as special tokens (after the BPE vocabulary)."""

VLM_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML with Qwen2-VL's image parts: ``{"type": "image"}`` renders as ``<|vision_start|><|image_pad|><|vision_end|>``."""

_QWEN2_PRETOKENIZE_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

_WORDS_TEXT = (
    "the a an is are was be of to in on at for with and or not what how many much if then so "
    "answer question problem solve compute calculate result number sum product difference total "
    "add plus minus times divided by equals step first second third final therefore because let "
    "we you i it this that there have has had each more less than left right some all "
    "apple apples orange oranges book books coin coins cat cats dog dogs box boxes train car hour hours "
    "day days week weeks price cost buy sell bought sold gives gets has paid dollars cents "
    "please reason put your within search calculator tool call response query find result user "
    "assistant system think thinking yes no true false correct wrong"
)


def _corpus() -> list[str]:
    """The fixed training corpus of the tiny tokenizer (independent of the seed)."""
    rng = random.Random(1234)
    words_all = _WORDS_TEXT.split()
    lines: list[str] = []
    ops = ("+", "-", "*", "/")
    for _ in range(600):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(ops)
        lines.append(f"What is {a} {op} {b}? The answer is \\boxed{{{a}{op}{b}}}.")
        lines.append(f"{a} {op} {b} = ")
    for _ in range(400):
        words = rng.sample(words_all, k=8)
        lines.append(" ".join(words).capitalize() + ".")
    lines.append(" ".join(words_all))
    lines.append("Please reason step by step, and put your final answer within \\boxed{}.")
    for _ in range(50):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(
            f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}</tool_call>'
        )
        lines.append(f"<tool_response>\n{a * b}\n</tool_response>")
        lines.append(f"<|im_start|>user\nWhat is {a} * {b}?<|im_end|>\n<|im_start|>assistant\n")
    return lines


def _train_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # The Qwen2 pre-tokenizer (digits split one by one) + byte-level BPE: transformers' ``Qwen2Tokenizer``
    # rebuilds exactly this pipeline when it loads a ``qwen2`` checkpoint, so every loader agrees.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *TOOL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def make_tiny_model_dir(
    path: str | Path,
    *,
    arch: Literal["qwen2", "llama"] = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    vocab_size: int = 512,
) -> Path:
    """Write a tiny randomly initialised causal LM with a locally trained tokenizer.

    The same ``(arch, hidden_size, num_layers, seed, vocab_size)`` always yields byte-identical weights and
    tokenizer files.

    Args:
        path: Output directory (created if missing; existing files of the same names are overwritten).
        arch: ``"qwen2"`` (``Qwen2ForCausalLM``) or ``"llama"`` (``LlamaForCausalLM``).
        hidden_size: Model width; must be a multiple of 16 (4 heads, 2 key/value heads).
        num_layers: Number of decoder layers (>= 1).
        seed: Seed of the weight initialisation.
        vocab_size: Target BPE vocabulary size (>= 300; byte alphabet + specials + merges).

    Returns:
        The checkpoint directory as a :class:`~pathlib.Path`.

    Raises:
        ValueError: On an unknown ``arch`` or invalid sizes.
    """
    if arch not in ("qwen2", "llama"):
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    if hidden_size < 16 or hidden_size % 16:
        raise ValueError(f"hidden_size must be a positive multiple of 16, got {hidden_size}")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300, got {vocab_size}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    raw = _train_tokenizer(vocab_size)
    eos = "<|im_end|>"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=eos,
        pad_token=eos,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[SPECIAL_TOKENS[1]],
        model_max_length=2048,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    eos_id = raw.token_to_id(eos)

    common: dict[str, Any] = {
        "vocab_size": raw.get_vocab_size(),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "bos_token_id": raw.token_to_id(SPECIAL_TOKENS[0]),
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "rms_norm_eps": 1e-6,
    }
    config = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(
        bos_token_id=common["bos_token_id"], eos_token_id=eos_id, pad_token_id=eos_id
    )
    model.save_pretrained(out)
    meta = {
        "rlinf_tiny_model": {"arch": arch, "hidden_size": hidden_size, "num_layers": num_layers, "seed": seed}
    }
    (out / "rlinf_tiny_model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def local_llm_actor(cfg: Any, algorithm: Any, **kwargs: Any) -> Any:
    """An ``LLMActorWorker`` of one rank in this process, without Ray (the context a group launch installs).

    Args:
        cfg: the ``LLMActorConfig``.
        algorithm: the ``AlgorithmConfig``.
        kwargs: the worker's other constructor arguments (``total_steps``, ...).
    """
    from rlinf_scheduler import PackedPlacementStrategy, StaticClusterView, WorkerContext

    from ._actor_worker import LLMActorWorker

    placement = PackedPlacementStrategy(0, 0).get_placement(StaticClusterView(num_nodes=1, accelerators=1))[0]
    worker = LLMActorWorker.__new__(LLMActorWorker)
    worker._rlinf_context = WorkerContext(
        group_name="actor",
        rank=0,
        world_size=1,
        namespace="test",
        placement=placement,
        node_ip="127.0.0.1",
        master_addr="127.0.0.1",
        env_vars={},
    )
    worker.__init__(cfg, algorithm, **kwargs)  # type: ignore[misc]
    return worker


def random_grpo_batch(
    seed: int, *, rows: int = 4, prompt_len: int = 4, response_len: int = 4
) -> dict[str, Any]:
    """A training batch of random token ids (3..499) without padding, for actor tests.

    The response tokens are trained; the first half of the rows has advantage +1, the second half -1.
    """
    g = torch.Generator().manual_seed(seed)
    t = prompt_len + response_len
    ids = torch.randint(3, 500, (rows, t), generator=g)
    loss_mask = torch.zeros(rows, t, dtype=torch.long)
    loss_mask[:, prompt_len:] = 1
    sign = torch.where(torch.arange(rows) < rows // 2, 1.0, -1.0)
    adv = sign[:, None].expand(rows, t).contiguous()
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "loss_mask": loss_mask,
        "advantages": adv,
    }


def make_tiny_vlm_dir(
    path: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    vision_depth: int = 2,
    vision_hidden_size: int = 32,
    seed: int = 0,
    vocab_size: int = 512,
    max_pixels: int = 112 * 112,
) -> Path:
    """Write a tiny randomly initialised Qwen2.5-VL checkpoint with its tokenizer and image processor.

    The directory has what a real Qwen2.5-VL checkpoint has for this code path: ``config.json``
    (``model_type: qwen2_5_vl``, a ``text_config`` and a ``vision_config``), ``model.safetensors``, the tokenizer
    files (the tiny BPE of :func:`make_tiny_model_dir` plus :data:`VISION_TOKENS`, chat template
    :data:`VLM_CHAT_TEMPLATE`) and ``preprocessor_config.json`` (Qwen2-VL's image processor: 14-pixel patches,
    merged 2 x 2, images resized to at most ``max_pixels``). It loads with
    ``AutoModelForImageTextToText`` / ``AutoTokenizer`` / ``AutoImageProcessor.from_pretrained``. The same
    arguments always give byte-identical weights.

    Args:
        path: output directory.
        hidden_size: width of the language model (a multiple of 16: 4 heads of ``hidden_size / 4``).
        num_layers: decoder layers.
        vision_depth: vision transformer blocks (the last one uses full attention, the others windows).
        vision_hidden_size: width of the vision transformer (2 heads).
        seed: seed of the weight initialisation.
        vocab_size: BPE vocabulary size before the vision tokens.
        max_pixels: largest image area after the processor's resize (smaller images keep their size, rounded
            to multiples of 28, at least 56 x 56).

    Returns:
        The checkpoint directory.
    """
    if hidden_size < 16 or hidden_size % 16:
        raise ValueError(f"hidden_size must be a positive multiple of 16, got {hidden_size}")
    if vision_hidden_size < 8 or vision_hidden_size % 8:
        raise ValueError(f"vision_hidden_size must be a positive multiple of 8, got {vision_hidden_size}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    raw = _train_tokenizer(vocab_size)
    raw.add_special_tokens(list(VISION_TOKENS))
    eos = "<|im_end|>"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=eos,
        pad_token=eos,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[SPECIAL_TOKENS[1], *VISION_TOKENS],
        model_max_length=4096,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    ids: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS, *VISION_TOKENS):
        found = raw.token_to_id(token)
        assert found is not None  # added as special tokens above
        ids[token] = found
    half = hidden_size // 4 // 2
    # Qwen2.5-VL splits each head's rotary frequencies over (time, height, width), in its proportions
    # (16, 24, 24 of 64); the sections sum to head_dim / 2.
    spatial = 3 * half // 8
    mrope = [half - 2 * spatial, spatial, spatial]
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": raw.get_vocab_size(),
            "hidden_size": hidden_size,
            "intermediate_size": 2 * hidden_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope},
            "bos_token_id": ids[SPECIAL_TOKENS[0]],
            "eos_token_id": ids[eos],
            "pad_token_id": ids[eos],
        },
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_hidden_size,
            "intermediate_size": 2 * vision_hidden_size,
            "num_heads": 2,
            "out_hidden_size": hidden_size,
            "fullatt_block_indexes": [vision_depth - 1],
            "window_size": 56,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        tie_word_embeddings=True,
    )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
        model.float()
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(
        bos_token_id=ids[SPECIAL_TOKENS[0]], eos_token_id=ids[eos], pad_token_id=ids[eos]
    )
    model.save_pretrained(out)
    Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=max_pixels).save_pretrained(out)
    meta = {
        "rlinf_tiny_model": {
            "arch": "qwen2_5_vl",
            "hidden_size": hidden_size,
            "num_layers": num_layers,
            "vision_depth": vision_depth,
            "seed": seed,
        }
    }
    (out / "rlinf_tiny_model.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out
