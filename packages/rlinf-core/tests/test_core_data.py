"""Prompt datasets (JSONL / Parquet), the sampler, the chat prompt encoder and batch packing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rlinf_core.data import (
    ChatPromptEncoder,
    DatasetError,
    PromptExample,
    PromptSampler,
    load_prompt_dataset,
    pack_sequences,
)


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_prompt_messages_answers_and_extra(tmp_path: Path) -> None:
    path = _write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"prompt": "1 + 2 =", "answer": 3, "level": 1},
            "",
            {
                "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2"}],
                "answer": ["4", 4.0],
            },
            {"prompt": "x", "answer": "7", "solution": "7 \\boxed{7}"},
        ],
    )
    ds = load_prompt_dataset(path)
    assert len(ds) == 3 and ds.source == str(path)
    assert ds[0].messages == ({"role": "user", "content": "1 + 2 ="},)
    assert ds[0].answers == ("3",) and ds[0].extra == {"level": 1} and ds[0].solution is None
    assert ds[1].answers == ("4", "4.0") and ds[1].prompt_text == "2+2"
    assert ds[2].solution == "7 \\boxed{7}"
    assert len(ds[1:]) == 2
    assert len(load_prompt_dataset(path, limit=2)) == 2


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [{"prompt": "a", "answer": 1}, {"question": "b", "answer": 2}],
            r"d.jsonl:2: missing key 'prompt' \(or 'messages'\)",
        ),
        ([{"prompt": "a"}], r"d.jsonl:1: missing key 'answer'"),
        (["{not json"], r"d.jsonl:1: invalid JSON"),
        ([{"prompt": "a", "answer": True}], r"'answer' must be a string, a number or a list"),
        (
            [{"messages": [{"role": "robot", "content": "x"}], "answer": 1}],
            r"role is 'robot'; allowed: system, user",
        ),
        ([{"prompt": "", "answer": 1}], r"'prompt' must be a non-empty string"),
        ([["a", 1]], r"a row must be a JSON object"),
    ],
)
def test_jsonl_errors_name_file_line_and_key(tmp_path: Path, rows: list[Any], message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        load_prompt_dataset(_write_jsonl(tmp_path / "d.jsonl", rows))


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_prompt_dataset(tmp_path / "missing.jsonl")
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match=r"unknown dataset format '.csv'; allowed: .jsonl"):
        load_prompt_dataset(tmp_path / "d.csv")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="no rows"):
        load_prompt_dataset(tmp_path / "e.jsonl")
    with pytest.raises(DatasetError, match=r"missing key 'solution' \(SFT needs"):
        load_prompt_dataset(
            _write_jsonl(tmp_path / "f.jsonl", [{"prompt": "a", "answer": 1}]), require_solution=True
        )


def test_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"prompt": ["1+1", "2+3"], "answer": ["2", "5"], "id": [0, 1]})
    pq.write_table(table, tmp_path / "d.parquet")
    ds = load_prompt_dataset(tmp_path / "d.parquet")
    assert [e.answers for e in ds] == [("2",), ("5",)] and ds[1].extra == {"id": 1}
    pq.write_table(pa.table({"prompt": ["1+1"]}), tmp_path / "bad.parquet")
    with pytest.raises(DatasetError, match=r"bad.parquet row 0: missing key 'answer'"):
        load_prompt_dataset(tmp_path / "bad.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        load_prompt_dataset(tmp_path / "junk.parquet")


def test_sampler_epochs_determinism_and_resume() -> None:
    s = PromptSampler(5, seed=3)
    first = s.next_batch(3) + s.next_batch(3)  # crosses into epoch 1
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and s.epoch == 1
    state = s.state_dict()
    rest = s.next_batch(4)
    s2 = PromptSampler(5, seed=3)
    s2.load_state_dict(state)
    assert s2.next_batch(4) == rest
    assert PromptSampler(4, shuffle=False).next_batch(6) == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="dataset of 5 examples, this one has 6"):
        PromptSampler(6).load_state_dict(state)


class _Tok:
    """A tokenizer stand-in: one id per character, a trivial chat template."""

    chat_template = "x"
    eos_token_id = 99
    pad_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        assert add_special_tokens is False
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool, tokenize: bool
    ) -> str:
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role'][0]}>{m['content']}" for m in messages) + "<a>"


def test_chat_prompt_encoder() -> None:
    enc = ChatPromptEncoder(_Tok(), system_prompt="S")
    ex = PromptExample(messages=({"role": "user", "content": "hi"},), answers=("1",))
    assert enc.prompt_text(ex) == "<s>S<u>hi<a>"
    assert enc.encode_prompt(ex) == [ord(c) for c in "<s>S<u>hi<a>"]
    assert enc.encode_completion("ok") == [ord("o"), ord("k"), 99]
    assert enc.pad_token_id == 99  # no pad token: eos pads
    plain = ChatPromptEncoder(_Tok(), use_chat_template=False)
    assert plain.prompt_text(ex) == "hi"


def test_pack_sequences_layout() -> None:
    out = pack_sequences([[1, 2, 3], [4]], [[7], [8, 9]], pad_token_id=0, train_response=[True, False])
    assert out["input_ids"].tolist() == [[1, 2, 3, 7, 0], [0, 0, 4, 8, 9]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert out["response_mask"].tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    assert not out["loss_mask"][1].any() and out["loss_mask"][0].tolist() == [0, 0, 0, 1, 0]
    assert out["prompt_lengths"].tolist() == [3, 1] and out["response_lengths"].tolist() == [1, 2]
    assert out["input_ids"].dtype == np.int64 and out["loss_mask"].dtype == bool
    wide = pack_sequences([[1]], [[2]], pad_token_id=0, prompt_length=3, response_length=2)
    assert wide["input_ids"].tolist() == [[0, 0, 1, 2, 0]]
    with pytest.raises(ValueError, match="shorter than the data"):
        pack_sequences([[1, 2]], [[2]], pad_token_id=0, prompt_length=1)
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        pack_sequences([[1], [2]], [[2]], pad_token_id=0)
