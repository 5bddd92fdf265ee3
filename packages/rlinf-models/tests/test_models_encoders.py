"""Observation encoders (vectors, images, both), DrQ's random shift, and dict observations through the trainers."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from rlinf_core.config import AlgorithmConfig, ReplayBufferConfig
from rlinf_core.protocols import EnvSpec, ObsSpec, obs_map
from rlinf_models import EmbodiedActorConfig, OptimConfig
from rlinf_models.embodied import EmbodiedPPOTrainer
from rlinf_models.offpolicy import ReplayBuffer, SACTrainer
from rlinf_models.policies import PolicyConfig, SquashedGaussianPolicy, build_policy
from rlinf_models.policies._encoders import ObsEncoder, random_shift

CAMERAS = EnvSpec(
    (),
    "continuous",
    2,
    action_low=(-1.0, -1.0),
    action_high=(1.0, 1.0),
    obs_dict={
        "rgb": ObsSpec((40, 40, 3), "uint8"),
        "wrist_rgb": ObsSpec((40, 40, 3), "uint8"),
        "depth": ObsSpec((40, 40, 1), "int16"),
        "state": ObsSpec((5,)),
        "privileged_state": ObsSpec((9,)),
    },
)


def _obs(n: int, *, t: int | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lead = (n,) if t is None else (t, n)
    return {
        "rgb": torch.randint(0, 256, (*lead, 40, 40, 3), generator=g, dtype=torch.uint8),
        "wrist_rgb": torch.randint(0, 256, (*lead, 40, 40, 3), generator=g, dtype=torch.uint8),
        "depth": torch.randint(0, 3000, (*lead, 40, 40, 1), generator=g, dtype=torch.int16),
        "state": torch.randn(*lead, 5, generator=g),
        "privileged_state": torch.randn(*lead, 9, generator=g),
    }


@pytest.mark.parametrize("model_type", ["cnn", "resnet"])
def test_each_camera_gets_a_torso_and_vectors_are_appended(model_type: str) -> None:
    cfg = PolicyConfig(
        model_type=model_type, obs_keys=("rgb", "wrist_rgb", "depth", "state"), image_feature_dim=32
    )  # type: ignore[arg-type]
    enc = ObsEncoder(CAMERAS, cfg)
    assert sorted(enc.images) == ["depth", "rgb", "wrist_rgb"] and enc.vector_keys == ["state"]
    assert enc.out_dim == 3 * 32 + 5
    obs = _obs(3)
    feat = enc(obs)
    assert feat.shape == (3, 101) and feat.dtype == torch.float32
    torch.testing.assert_close(feat[:, -5:], obs["state"])  # vectors pass through, after the images
    changed = dict(obs, privileged_state=torch.zeros(3, 9))
    torch.testing.assert_close(enc(changed), feat)  # a left-out entry is never read


def test_obs_key_and_model_type_errors_name_the_field() -> None:
    with pytest.raises(
        ValueError,
        match=r"actor.model.obs_keys: \['goal'\] not in the observation; allowed: rgb, wrist_rgb, depth, state, privileged_state",
    ):
        ObsEncoder(CAMERAS, PolicyConfig(model_type="cnn", obs_keys=("rgb", "goal")))
    with pytest.raises(ValueError, match="model_type 'mlp' cannot encode images"):
        ObsEncoder(CAMERAS, PolicyConfig())
    mlp = ObsEncoder(CAMERAS, PolicyConfig(obs_keys=("state", "privileged_state")))
    assert mlp.out_dim == 14
    with pytest.raises(ValueError, match="'resnet' needs image observations"):
        ObsEncoder(CAMERAS, PolicyConfig(model_type="resnet", obs_keys=("state",)))


def test_random_shift_equals_replicate_pad_then_crop() -> None:
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (6, 9, 7, 3), generator=g, dtype=torch.uint8)
    pad = 2
    shifts = torch.randint(0, 2 * pad + 1, (6, 2), generator=g)
    out = random_shift(images, shifts, pad)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    padded = torch.nn.functional.pad(
        images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate"
    )
    for n in range(6):
        dy, dx = int(shifts[n, 0]), int(shifts[n, 1])
        want = padded[n, :, dy : dy + 9, dx : dx + 7].permute(1, 2, 0).to(torch.uint8)
        torch.testing.assert_close(out[n], want)
    centre = torch.full((6, 2), pad)
    torch.testing.assert_close(random_shift(images, centre, pad), images)


def test_ppo_trains_on_dict_observations() -> None:
    torch.manual_seed(0)
    model = PolicyConfig(
        model_type="cnn", obs_keys=("rgb", "state"), hidden_sizes=(16,), image_feature_dim=16
    )
    policy = build_policy(CAMERAS, model)
    actor = EmbodiedActorConfig(
        model=model, global_batch_size=8, micro_batch_size=4, optim=OptimConfig(lr=1e-3)
    )
    trainer = EmbodiedPPOTrainer(policy, AlgorithmConfig(update_epoch=1), actor)
    t, e = 4, 2
    g = torch.Generator().manual_seed(0)
    batch: dict[str, Any] = {
        "obs": _obs(e, t=t),
        "actions": torch.randn(t, e, 1, 2, generator=g),
        "rewards": torch.rand(t, e, 1, generator=g),
        "dones": torch.zeros(t + 1, e, 1, dtype=torch.bool),
        "prev_logprobs": torch.full((t, e, 2), -1.0),
        "prev_values": torch.zeros(t + 1, e, 1),
    }
    batch = trainer.compute_advantages_and_returns(batch)
    before = [p.detach().clone() for p in policy.encoder.parameters()]
    metrics = trainer.train(batch)
    assert torch.isfinite(torch.tensor(metrics["actor/policy_loss"]))
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.encoder.parameters(), strict=True))
    bad = dict(batch, obs=dict(batch["obs"], state=torch.zeros(t + 1, e, 5)))
    with pytest.raises(ValueError, match=r"obs\['state'\] must start with \[T=4, E=2\]"):
        trainer.train(bad)


def test_replay_buffer_keeps_dict_observations_and_their_dtypes() -> None:
    buf = ReplayBuffer(8, seed=0)
    obs = obs_map(lambda x: x[:5], _obs(5))
    buf.add({"obs": obs, "rewards": torch.arange(5.0)})
    assert set(buf.keys) == {f"obs/{k}" for k in CAMERAS.obs_dict or {}} | {"rewards"}  # stored flat
    got = buf.contents()
    assert got["obs"]["rgb"].dtype == torch.uint8 and torch.equal(got["obs"]["depth"], obs["depth"])
    again = ReplayBuffer(8)
    again.load_state_dict(buf.state_dict())
    assert torch.equal(again.sample(4)["obs"]["rgb"], buf.sample(4)["obs"]["rgb"])


def test_sac_with_random_shift_on_camera_observations() -> None:
    model = PolicyConfig(
        model_type="cnn",
        obs_keys=("rgb", "state"),
        hidden_sizes=(16,),
        image_feature_dim=16,
        add_value_head=False,
        add_q_head=True,
        image_aug="random_shift",
    )
    actor = EmbodiedActorConfig(
        model=model, global_batch_size=4, micro_batch_size=4, optim=OptimConfig(lr=1e-3)
    )
    alg = AlgorithmConfig(
        loss_type="embodied_sac",
        adv_type="embodied_sac",
        replay_buffer=ReplayBufferConfig(cache_size=32, min_buffer_size=4),
    )
    torch.manual_seed(0)
    trainer = SACTrainer(SquashedGaussianPolicy(CAMERAS, model), CAMERAS, actor, alg)
    n = 6
    trainer.add_trajectory(
        {
            "obs": _obs(1, t=n),
            "next_obs": _obs(1, t=n, seed=1),
            "actions": torch.rand(n, 1, 1, 2) * 2 - 1,
            "rewards": torch.randn(n, 1, 1),
            "terminations": torch.zeros(n, 1, 1, dtype=torch.bool),
        }
    )
    shifted = trainer._augment(_obs(4))
    assert shifted["rgb"].dtype == torch.uint8 and torch.equal(shifted["state"], _obs(4)["state"])
    assert not torch.equal(shifted["rgb"], _obs(4)["rgb"])  # 25 offsets; all four at the centre: 1 in 390k
    assert trainer.update(2)["sac/num_updates"] == 2.0
    no_images = attrs.evolve(model, obs_keys=None, model_type="mlp")
    vec = EnvSpec((3,), "continuous", 2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    with pytest.raises(ValueError, match=r"actor\.model\.image_aug: 'random_shift' needs image observations"):
        SACTrainer(SquashedGaussianPolicy(vec, no_images), vec, attrs.evolve(actor, model=no_images), alg)
