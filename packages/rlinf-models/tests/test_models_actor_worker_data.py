"""Data parallel layout without Ray: the stratified shuffle and the ordering of trajectory messages."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig
from rlinf_models.embodied import EmbodiedPPOTrainer
from rlinf_models.embodied._actor_worker import _concat_messages
from rlinf_models.policies import PolicyConfig, build_policy

SPEC = EnvSpec((3,), "discrete", 1, num_actions=2)


def _trainer(world: int, rank: int, gbs: int, mbs: int = 1) -> EmbodiedPPOTrainer:
    policy = build_policy(SPEC, PolicyConfig(hidden_sizes=(4,)))
    actor = EmbodiedActorConfig(global_batch_size=gbs, micro_batch_size=mbs, seed=3)
    return EmbodiedPPOTrainer(
        policy, AlgorithmConfig(), actor, world_size=world, rank=rank, reduce_sum=lambda x: x
    )


@pytest.mark.parametrize(
    ("t", "e", "gbs", "world"),
    [(8, 8, 16, 2), (8, 8, 16, 4), (5, 6, 4, 2), (4, 12, 6, 3), (7, 4, 28, 2), (3, 16, 8, 8)],
)
def test_ranks_split_every_minibatch_of_one_rank_into_contiguous_blocks(
    t: int, e: int, gbs: int, world: int
) -> None:
    one = _trainer(1, 0, gbs)
    many = [_trainer(world, r, gbs) for r in range(world)]
    e_local = e // world
    for _epoch in range(3):  # the generator advances identically on every rank
        ref = one.epoch_minibatches(t, e)
        parts = [tr.epoch_minibatches(t, e_local) for tr in many]
        assert len(ref) == (t * e) // gbs and all(len(p) == len(ref) for p in parts)
        for m, batch in enumerate(ref):
            assert batch.numel() == gbs
            glob = []
            for r in range(world):
                local = parts[r][m]
                assert local.numel() == gbs // world
                # local flat index t * e_local + j  →  global flat index t * e + r * e_local + j
                glob.append((local // e_local) * e + r * e_local + local % e_local)
            assert torch.equal(torch.cat(glob), batch)  # same samples, same order, rank r = block r
        flat = torch.cat(ref)
        assert flat.unique().numel() == flat.numel()  # no sample twice in an epoch
        # Stratified: each of the gcd(E, G) env units contributes equally to every mini-batch.
        units = math.gcd(e, gbs)
        for batch in ref:
            unit_of = (batch % e) // (e // units)
            assert torch.bincount(unit_of, minlength=units).tolist() == [gbs // units] * units


def test_shuffle_differs_between_epochs_and_seeds() -> None:
    a = _trainer(1, 0, 8)
    first, second = a.epoch_minibatches(8, 4), a.epoch_minibatches(8, 4)
    assert not all(torch.equal(x, y) for x, y in zip(first, second, strict=True))


def _msg(offset: int | None, e: int = 2, seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    msg: dict[str, object] = {
        "obs": torch.randn(3, e, 3, generator=g),
        "actions": torch.zeros(3, e, 1, dtype=torch.long),
        "rewards": torch.rand(3, e, 1, generator=g),
        "dones": torch.zeros(4, e, 1, dtype=torch.bool),
        "prev_logprobs": torch.zeros(3, e, 1),
        "prev_values": torch.randn(4, e, 1, generator=g),
        "note": "ignored",
    }
    if offset is not None:
        msg["env_offset"] = offset
    return msg


def test_messages_are_ordered_by_env_offset_and_concatenated_along_envs() -> None:
    msgs = [_msg(o, seed=o) for o in (0, 2, 4)]
    for perm in itertools.permutations(msgs):
        out = _concat_messages(list(perm))
        assert set(out) == {"obs", "actions", "rewards", "dones", "prev_logprobs", "prev_values"}
        assert out["rewards"].shape == (3, 6, 1) and out["dones"].shape == (4, 6, 1)
        torch.testing.assert_close(out["obs"][:, 2:4], msgs[1]["obs"])  # type: ignore[arg-type]


def test_messages_without_offsets_get_one_order_whatever_the_arrival() -> None:
    msgs = [_msg(None, seed=s) for s in range(3)]
    outs = [_concat_messages(list(p))["rewards"] for p in itertools.permutations(msgs)]
    assert all(torch.equal(o, outs[0]) for o in outs)


def test_bad_messages_are_explained() -> None:
    with pytest.raises(ValueError, match="some trajectory messages carry 'env_offset'"):
        _concat_messages([_msg(0), _msg(None, seed=1)])
    broken = _msg(0)
    del broken["rewards"]
    with pytest.raises(ValueError, match=r"missing tensors \['rewards'\]"):
        _concat_messages([broken])
