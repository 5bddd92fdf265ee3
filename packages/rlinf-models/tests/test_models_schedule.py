"""The shared PPO update schedule (``rlinf_models.actor``): splits, loop, metric reduction, LR schedule."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rlinf_models.actor import (
    SUM_PREFIX,
    MetricMeans,
    accumulate_gradients,
    clip_gradients,
    loss_shares,
    lr_scale,
    mean_over_ranks,
    micro_batches,
    run_update,
    shuffled_minibatches,
    token_budget_micro_batches,
)


def test_rank_shares_tile_the_one_rank_minibatches() -> None:
    one = shuffled_minibatches(
        20, global_batch_size=8, rank=0, world_size=1, generator=torch.Generator().manual_seed(1)
    )
    assert [len(m) for m in one] == [8, 8, 4]
    assert sorted(torch.cat(one).tolist()) == list(range(20))
    parts = [
        shuffled_minibatches(
            20, global_batch_size=8, rank=r, world_size=2, generator=torch.Generator().manual_seed(1)
        )
        for r in range(2)
    ]
    for k, mini in enumerate(one):
        assert torch.equal(torch.cat([parts[0][k], parts[1][k]]), mini)


def test_micro_batches_cut_in_order_and_drop_a_remainder() -> None:
    rows = torch.arange(10)
    assert [m.tolist() for m in micro_batches(rows, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_run_update_draws_once_per_epoch_and_counts_steps() -> None:
    draws: list[int] = []
    seen: list[list[int]] = []

    def minibatches() -> list[torch.Tensor]:
        draws.append(1)
        return [torch.tensor([0, 1]), torch.tensor([2, 3])]

    steps = run_update(epochs=3, minibatches=minibatches, step=lambda rows: seen.append(rows.tolist()))
    assert steps == 6 and len(draws) == 3 and seen[:2] == [[0, 1], [2, 3]]


def test_metric_means_average_and_sum_apart() -> None:
    m = MetricMeans()
    m.add({"a": 1.0, f"{SUM_PREFIX}x": 2.0})
    m.add({"a": 3.0, "b": 5.0, f"{SUM_PREFIX}x": 4.0})
    assert m.means() == {"a": 2.0, "b": 5.0}
    assert dict(m.totals) == {f"{SUM_PREFIX}x": 6.0}


def test_mean_over_ranks() -> None:
    assert mean_over_ranks({"a": 1.0}, 1, None) == {"a": 1.0}
    assert mean_over_ranks({"a": 1.0, "b": 3.0}, 2, lambda t: t * 2 + 2) == {"a": 2.0, "b": 4.0}
    with pytest.raises(ValueError, match="world_size=2 needs reduce_sum"):
        mean_over_ranks({"a": 1.0}, 2, None)


def test_accumulate_gradients_is_the_mean_of_micro_batch_gradients() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    w.grad = torch.tensor([100.0])  # stale: zeroed first
    m = MetricMeans()
    accumulate_gradients([1.0, 3.0], lambda x: ((w * x).sum(), {"x": x}), opt, m)
    assert w.grad is not None and float(w.grad) == 2.0
    assert m.means() == {"x": 2.0}
    assert clip_gradients([w], 0.5) == 2.0 and float(w.grad) == pytest.approx(0.5)


def test_lr_scale() -> None:
    assert lr_scale("constant", 5, 10) == 1.0
    assert lr_scale("linear", 5, 10) == 0.5
    assert lr_scale("linear", 20, 10) == 0.0
    assert lr_scale("linear", 5, None) == 1.0


def test_resumed_schedule_keeps_the_total_it_started_with_unless_reset() -> None:
    from rlinf_models.actor import lr_scale, resumed_schedule_total

    warnings: list[str] = []
    assert resumed_schedule_total(4, 4, reset=False, warn=warnings.append) == 4
    assert resumed_schedule_total(None, 8, reset=False, warn=warnings.append) == 8  # older checkpoint
    assert warnings == []
    kept = resumed_schedule_total(4, 8, reset=False, warn=warnings.append)
    assert kept == 4 and lr_scale("linear", 2, kept) == 0.5  # the decay the 4-step run would have had
    assert "had 4 training steps, this run has 8" in warnings[-1] and "keeps its total of 4" in warnings[-1]
    assert "actor.optim.reset_lr_schedule_on_resume=true" in warnings[-1]
    assert resumed_schedule_total(4, 8, reset=True, warn=warnings.append) == 8
    assert "rebuilt over 8" in warnings[-1] and len(warnings) == 2


def test_token_budget_micro_batches_pack_in_order_within_the_budget() -> None:
    rows = torch.tensor([5, 3, 9, 0, 7, 1])
    tokens = torch.tensor([4, 4, 10, 3, 3, 3])
    micro = token_budget_micro_batches(rows, tokens, 8)
    assert [m.tolist() for m in micro] == [[5, 3], [9], [0, 7], [1]]  # the 10-token row alone
    assert [m.tolist() for m in token_budget_micro_batches(rows, tokens, 100)] == [rows.tolist()]
    assert token_budget_micro_batches(rows[:0], tokens[:0], 8) == []


def test_token_budget_micro_batches_with_a_count_balance_the_largest() -> None:
    rows = torch.arange(6)
    tokens = torch.tensor([4, 4, 10, 3, 3, 3])
    micro = token_budget_micro_batches(rows, tokens, 8, count=2)
    assert [m.tolist() for m in micro] == [
        [0, 1, 2],
        [3, 4, 5],
    ]  # sums 18 and 9: no cut has a smaller largest
    assert len(token_budget_micro_batches(rows, tokens, 8, count=6)) == 6
    with pytest.raises(ValueError, match="count must be in"):
        token_budget_micro_batches(rows, tokens, 8, count=7)


@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=30),
    st.integers(1, 80),
    st.integers(1, 30),
)
def test_token_budget_micro_batches_cover_every_row_once(sizes: list[int], budget: int, count: int) -> None:
    rows = torch.arange(len(sizes)) * 3
    tokens = torch.tensor(sizes)
    fewest = token_budget_micro_batches(rows, tokens, budget)
    assert torch.equal(torch.cat(fewest), rows)
    assert all(int(tokens[m // 3].sum()) <= budget or m.shape[0] == 1 for m in fewest)
    count = min(max(count, len(fewest)), len(sizes))
    exact = token_budget_micro_batches(rows, tokens, budget, count=count)
    assert len(exact) == count and all(m.shape[0] > 0 for m in exact)
    assert torch.equal(torch.cat(exact), rows)


def test_accumulate_gradients_with_weights() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    metrics = MetricMeans()
    micro = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])]
    accumulate_gradients(micro, lambda x: ((w * x).sum(), {}), opt, metrics, [0.25, 0.75])
    assert w.grad is not None and torch.allclose(w.grad, torch.tensor([0.25, 2.25]))
    with pytest.raises(ValueError, match="1 weights for 2 micro-batches"):
        accumulate_gradients(micro, lambda x: ((w * x).sum(), {}), opt, metrics, [1.0])


def test_loss_shares_weigh_by_loss_tokens_or_rows() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]])
    micro = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    assert loss_shares(micro, mask, "token-mean") == [0.5, 0.5]
    assert loss_shares([torch.tensor([0]), torch.tensor([1, 2, 3])], mask, "token-mean") == [2 / 6, 4 / 6]
    assert loss_shares([torch.tensor([0]), torch.tensor([1, 2, 3])], mask, "seq-mean-token-mean") == [
        0.25,
        0.75,
    ]
    assert loss_shares([torch.tensor([3])], mask, "token-mean") is None


def test_metric_means_of_tensors_equal_those_of_floats() -> None:
    # Tensor values are summed in float64 where they live; the means are those of the floats, bit for bit.
    values = torch.randn(7, generator=torch.Generator().manual_seed(0))
    weights = [0.1, 0.3, 0.05, 0.2, 0.15, 0.12, 0.08]
    as_floats, as_tensors = MetricMeans(), MetricMeans()
    for v, w in zip(values, weights, strict=True):
        as_floats.add({"a": float(v), f"{SUM_PREFIX}x": float(v)}, w)
        as_tensors.add({"a": v, f"{SUM_PREFIX}x": v}, w)
    as_tensors.add({"b": 2.0})  # floats and tensors mix
    assert as_tensors.means() == as_floats.means() | {"b": 2.0}
    assert as_tensors.total_values() == as_floats.total_values() == dict(as_floats.totals)
    assert as_tensors.weighted_sums()["a"] == as_floats.weighted_sums()["a"]
