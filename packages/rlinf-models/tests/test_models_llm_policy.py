"""CausalLMPolicy: log-probs/entropy/values against a naive full-logits computation and against generate()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from rlinf_models.llm import CausalLMPolicy, LLMModelConfig, load_causal_lm, load_tokenizer
from rlinf_models.llm._varlen import VARLEN_SDPA, sequence_bounds, use_varlen_sdpa
from rlinf_models.llm.testing import make_tiny_model_dir

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "qwen2", arch="qwen2", seed=1)


def _naive(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-vocabulary reference: one loop over rows and positions."""
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float() / temperature
    lp = torch.zeros(ids.shape)
    ent = torch.zeros(ids.shape)
    for b in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            dist = torch.log_softmax(logits[b, t - 1], dim=-1)
            lp[b, t] = dist[ids[b, t]]
            ent[b, t] = -(dist.exp() * dist).sum()
    return lp, ent


def _batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    mask[1, -2:] = 0  # right padding
    ids[mask == 0] = 2
    return ids, mask


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_entropy_match_naive_reference(model_dir: Path, temperature: float) -> None:
    model = load_causal_lm(LLMModelConfig(model_path=str(model_dir)))
    policy = CausalLMPolicy(model, logprob_chunk_size=5)  # several chunks, one partial
    ids, mask = _batch(model.config.vocab_size)
    with torch.no_grad():
        out = policy(ids, mask, temperature=temperature, compute_entropy=True)
        ref_lp, ref_ent = _naive(model, ids, mask, temperature)
    assert out["logprobs"].shape == ids.shape and out["logprobs"].dtype == torch.float32
    assert "values" not in out
    valid = mask.bool() & torch.roll(mask.bool(), 1, dims=1)
    valid[:, 0] = False
    torch.testing.assert_close(out["logprobs"][valid], ref_lp[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["entropy"][valid], ref_ent[valid], rtol=1e-5, atol=1e-5)
    assert torch.all(out["logprobs"][:, 0] == 0)


def test_gradients_of_chunked_checkpointed_path_match_unchunked(model_dir: Path) -> None:
    ids, mask = _batch(512, seed=1)
    grads = []
    for chunk in (4, 10_000):
        torch.manual_seed(0)
        policy = CausalLMPolicy(
            load_causal_lm(LLMModelConfig(model_path=str(model_dir))),
            add_value_head=True,
            logprob_chunk_size=chunk,
        )
        out = policy(ids, mask, temperature=0.9, compute_entropy=True)
        loss = (out["logprobs"] * mask).sum() + 0.1 * out["entropy"].sum() + out["values"].pow(2).sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 5
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-6, msg=name)


def test_left_padding_does_not_change_scores(model_dir: Path) -> None:
    policy = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(model_dir))), add_value_head=True)
    g = torch.Generator().manual_seed(5)
    seq = torch.randint(3, 512, (1, 7), generator=g)
    padded = torch.cat([torch.full((1, 4), 2), seq], dim=1)
    pmask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a = policy(seq, torch.ones_like(seq), compute_entropy=True)
        b = policy(padded, pmask, compute_entropy=True)
    for key in ("logprobs", "entropy", "values"):
        torch.testing.assert_close(b[key][:, 5:], a[key][:, 1:], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_logprobs_match_generate_scores_for_sampled_tokens(tmp_path: Path, arch: str) -> None:
    path = make_tiny_model_dir(tmp_path / arch, arch=arch, seed=2)
    cfg = LLMModelConfig(model_path=str(path))
    tok, model = load_tokenizer(cfg), load_causal_lm(cfg)
    tok.padding_side = "left"
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False)
        for c in ("What is 3 + 4?", "Solve 12 * 7 and put the answer in \\boxed{}.")
    ]
    enc = tok(prompts, return_tensors="pt", padding=True)
    temperature = 0.8
    torch.manual_seed(0)
    gen = model.generate(
        **enc,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=12,
        output_scores=True,
        return_dict_in_generate=True,
    )
    seqs = gen.sequences
    p = enc.input_ids.shape[1]
    mask = torch.cat(
        [enc.attention_mask, torch.ones(seqs.shape[0], seqs.shape[1] - p, dtype=torch.long)], dim=1
    )
    expected = torch.stack(
        [
            torch.log_softmax(s.float(), -1).gather(-1, seqs[:, p + i, None]).squeeze(-1)
            for i, s in enumerate(gen.scores)
        ],
        dim=1,
    )
    with torch.no_grad():
        got = CausalLMPolicy(model)(seqs, mask, temperature=temperature)["logprobs"][:, p:]
    # Compare up to and including each row's first eos (generate pads the rest).
    is_eos = seqs[:, p:] == tok.eos_token_id
    valid = (is_eos.long().cumsum(1) - is_eos.long()) == 0
    assert valid.sum() >= 6
    torch.testing.assert_close(got[valid], expected[valid], rtol=1e-4, atol=1e-4)


def test_rejects_bad_inputs(model_dir: Path) -> None:
    policy = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(model_dir))))
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        policy(ids, torch.ones_like(ids), temperature=0.0)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        policy(ids, torch.ones(2, 5, dtype=torch.long))


def test_score_mask_scores_only_the_selected_positions(model_dir: Path) -> None:
    policy = CausalLMPolicy(load_causal_lm(LLMModelConfig(model_path=str(model_dir))), logprob_chunk_size=3)
    ids, mask = _batch(512, seed=4)
    select = torch.zeros_like(mask)
    select[:, 5:] = mask[:, 5:]
    full = policy(ids, mask, temperature=0.7, compute_entropy=True)
    part = policy(ids, mask, temperature=0.7, compute_entropy=True, score_mask=select)
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(part[key][select.bool()], full[key][select.bool()], rtol=1e-5, atol=1e-6)
        assert torch.all(part[key][~select.bool()] == 0)
    # Gradients reach the model through the selected positions only.
    (part["logprobs"].sum()).backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize(
    ("arch", "attn"),
    [
        ("qwen2", "sdpa"),
        ("qwen2", "eager"),
        ("llama", "sdpa"),
        ("qwen2", "varlen"),
        ("llama", "varlen"),
        ("llama", "varlen+checkpointing"),
    ],
)
def test_remove_padding_equals_the_padded_path_with_gradients(tmp_path: Path, arch: str, attn: str) -> None:
    """Packed rows score and differentiate as the padded batch. ``varlen`` (the FSDP actor's choice for packed
    micro-batches) attends per sequence with no mask at all, so a wrong split would mix rows; with activation
    checkpointing the backward pass recomputes the attention and must find the same sequences."""
    directory = make_tiny_model_dir(tmp_path / arch, arch=arch, seed=2)
    varlen = attn.startswith("varlen")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 512, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    mask[1, -3:] = 0  # right padding
    mask[2, :1] = 0
    mask[2, -1:] = 0
    mask[3, :11] = 0  # one live token
    ids[mask == 0] = 2
    valid = mask.bool() & torch.roll(mask.bool(), 1, dims=1)  # live, after a live token (a row's first has
    valid[:, 0] = False  # no context, in either path)
    score = (valid & (torch.arange(12) >= 3)).long()  # as a loss mask: no prompt tokens
    results = []
    for remove_padding in (False, True):
        torch.manual_seed(0)
        model_cfg = LLMModelConfig(
            model_path=str(directory),
            attn_implementation="sdpa" if varlen else attn,
            gradient_checkpointing=attn.endswith("checkpointing"),
        )
        model = load_causal_lm(model_cfg)
        if varlen:
            assert use_varlen_sdpa(model) and model.config._attn_implementation == VARLEN_SDPA
            model.train()  # transformers recomputes checkpointed layers in training mode only
        policy = CausalLMPolicy(model, add_value_head=True, logprob_chunk_size=7)
        out = policy(
            ids, mask, temperature=0.8, compute_entropy=True, score_mask=score, remove_padding=remove_padding
        )
        loss = (out["logprobs"] * score).sum() + 0.1 * (out["entropy"] * score).sum()
        loss = loss + (out["values"] * valid).pow(2).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        results.append(({k: v.detach() for k, v in out.items()}, grads))
    (padded, g_pad), (packed, g_pack) = results
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(packed[key] * score, padded[key] * score, rtol=1e-5, atol=1e-5, msg=key)
    torch.testing.assert_close(packed["values"][valid], padded["values"][valid], rtol=1e-5, atol=1e-5)
    assert g_pad.keys() == g_pack.keys() and len(g_pad) > 5
    for name in g_pad:
        torch.testing.assert_close(g_pack[name], g_pad[name], rtol=1e-4, atol=1e-5, msg=name)


def test_sequence_bounds_split_a_packed_row_where_positions_restart() -> None:
    assert sequence_bounds(torch.tensor([0, 1, 2, 0, 1, 0, 0, 1, 2, 3])) == [(0, 3), (3, 5), (5, 6), (6, 10)]
    assert sequence_bounds(torch.tensor([4, 5, 6])) == [(0, 3)]  # one sequence, whatever its first position
    assert sequence_bounds(torch.tensor([0, 1, 5, 6])) == [(0, 2), (2, 4)]  # a jump is a new sequence too
    assert sequence_bounds(torch.zeros(0, dtype=torch.long)) == []
    with pytest.raises(ValueError, match=r"\[L\]"):
        sequence_bounds(torch.zeros(2, 3, dtype=torch.long))


def test_varlen_model_keeps_the_padded_path_and_generation_exact(model_dir: Path) -> None:
    """With a padding mask the varlen implementation is transformers' sdpa: bit-equal scores and tokens."""
    ids, mask = _batch(512, seed=5)
    plain = load_causal_lm(LLMModelConfig(model_path=str(model_dir)))
    varlen = load_causal_lm(LLMModelConfig(model_path=str(model_dir)))
    assert use_varlen_sdpa(varlen)
    assert not use_varlen_sdpa(varlen)  # only a model on sdpa is switched
    a, b = CausalLMPolicy(plain)(ids, mask), CausalLMPolicy(varlen)(ids, mask)
    assert torch.equal(a["logprobs"], b["logprobs"])
    prompt = ids[:2, :6]
    kwargs = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 2}
    assert torch.equal(plain.generate(prompt, **kwargs), varlen.generate(prompt, **kwargs))


def test_default_chunking_bounds_the_logits_buffer_by_bytes() -> None:
    from rlinf_models.llm._policy import LOGPROB_CHUNK_BYTES, auto_chunk_rows, token_logprobs_and_entropy

    assert auto_chunk_rows(151_936) == 883  # Qwen2.5: 883 x 151,936 float32 logits stay within 512 MiB
    assert auto_chunk_rows(151_936) * 151_936 * 4 <= LOGPROB_CHUNK_BYTES < 884 * 151_936 * 4
    assert auto_chunk_rows(512) == 262_144 and auto_chunk_rows(2**40) == 1
    # Unset, a small vocabulary is scored in one chunk: equal to explicit chunks, with the same gradients.
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(8, 40, bias=False)
    hidden = torch.randn(50, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 40, (50,), generator=g)
    results = []
    for chunk in (None, 7):
        lp, ent = token_logprobs_and_entropy(hidden, targets, head, compute_entropy=True, chunk_size=chunk)
        assert ent is not None
        (grad,) = torch.autograd.grad(lp.sum() + ent.sum(), hidden)
        results.append((lp.detach(), ent.detach(), grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
