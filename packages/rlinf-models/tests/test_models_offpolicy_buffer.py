"""The replay buffer: ring wrap-around, window sampling, chunk layout, exact state round trips, save/load, RLPD mix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlinf_models.offpolicy import ReplayBuffer, SymmetricSampler, trajectory_transitions


def _batch(start: int, n: int, chunks: int = 2, dim: int = 3) -> dict[str, torch.Tensor]:
    ids = torch.arange(start, start + n, dtype=torch.float32)
    return {
        "obs": ids[:, None].repeat(1, 4),
        "actions": ids[:, None, None].repeat(1, chunks, dim),
        "rewards": ids[:, None].repeat(1, chunks),
        "terminations": torch.zeros(n, chunks, dtype=torch.bool),
        "next_obs": ids[:, None].repeat(1, 4) + 0.5,
    }


def _ids(buf: ReplayBuffer) -> list[int]:
    return [int(x) for x in buf.contents()["obs"][:, 0]]


def test_ring_wraps_and_keeps_the_newest_in_order() -> None:
    buf = ReplayBuffer(5)
    buf.add(_batch(0, 3))
    buf.add(_batch(3, 4))  # wraps: 7 added, capacity 5
    assert len(buf) == 5 and buf.total_added == 7
    assert _ids(buf) == [2, 3, 4, 5, 6]
    buf.add(_batch(7, 12))  # more than the capacity at once
    assert _ids(buf) == [14, 15, 16, 17, 18]
    assert buf.total_added == 19


def test_window_sampling_draws_only_the_latest() -> None:
    buf = ReplayBuffer(100, sample_window_size=10, seed=3)
    buf.add(_batch(0, 50))
    ids = buf.sample(2000)["obs"][:, 0]
    assert int(ids.min()) == 40 and int(ids.max()) == 49
    assert len(set(ids.tolist())) == 10  # uniform over the window: every one drawn
    whole = ReplayBuffer(100, seed=3)
    whole.add(_batch(0, 50))
    assert int(whole.sample(2000)["obs"][:, 0].min()) < 40


def test_window_after_wrap() -> None:
    buf = ReplayBuffer(8, sample_window_size=3, seed=0)
    buf.add(_batch(0, 11))  # newest 8 = 3..10, slots wrapped
    ids = set(buf.sample(500)["obs"][:, 0].tolist())
    assert ids == {8.0, 9.0, 10.0}


def test_chunk_layout_and_fields_are_kept() -> None:
    buf = ReplayBuffer(16)
    buf.add(_batch(0, 4, chunks=3, dim=2))
    out = buf.sample(7)
    assert out["actions"].shape == (7, 3, 2)
    assert out["rewards"].shape == (7, 3)
    assert out["terminations"].dtype == torch.bool
    # a sampled row is one transition: every field comes from the same id
    ids = out["obs"][:, 0]
    assert torch.equal(out["actions"][:, 0, 0], ids) and torch.equal(out["rewards"][:, 2], ids)
    assert torch.equal(out["next_obs"][:, 0], ids + 0.5)


def test_add_refuses_mismatched_batches() -> None:
    buf = ReplayBuffer(8)
    buf.add(_batch(0, 2))
    with pytest.raises(ValueError, match="per-transition shape"):
        buf.add(_batch(0, 2, chunks=3))
    bad = _batch(0, 2)
    del bad["rewards"]
    with pytest.raises(ValueError, match="fields"):
        buf.add(bad)
    bad = _batch(0, 2)
    bad["rewards"] = bad["rewards"][:1]
    with pytest.raises(ValueError, match="same leading size"):
        buf.add(bad)
    with pytest.raises(RuntimeError, match="empty"):
        ReplayBuffer(4).sample(1)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0)


def test_min_size_gates_ready() -> None:
    buf = ReplayBuffer(8, min_size=3)
    buf.add(_batch(0, 2))
    assert not buf.ready()
    buf.add(_batch(2, 1))
    assert buf.ready()


def test_state_dict_round_trip_is_exact() -> None:
    a = ReplayBuffer(6, sample_window_size=4, seed=5)
    a.add(_batch(0, 9))
    a.sample(3)  # advance the generator
    b = ReplayBuffer(6, sample_window_size=4, seed=99)
    b.load_state_dict(a.state_dict())
    assert b.total_added == a.total_added and _ids(b) == _ids(a)
    for _ in range(3):  # same samples, also after more (wrapping) adds
        sa, sb = a.sample(11), b.sample(11)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        a.add(_batch(100, 4))
        b.add(_batch(100, 4))
        assert _ids(b) == _ids(a)


def test_save_and_load(tmp_path: Path) -> None:
    a = ReplayBuffer(10, seed=1)
    a.add(_batch(0, 7))
    a.save(tmp_path / "buf.pt")
    b = ReplayBuffer.load(tmp_path / "buf.pt")
    assert b.capacity == 10 and _ids(b) == _ids(a)
    sa, sb = a.sample(5), b.sample(5)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    small = ReplayBuffer.load(tmp_path / "buf.pt", capacity=3, seed=0)
    assert _ids(small) == [4, 5, 6]


def test_symmetric_sampler_mixes_half_and_half() -> None:
    online = ReplayBuffer(100, min_size=2, seed=0)
    demo = ReplayBuffer(100, min_size=5, seed=1)
    mix = SymmetricSampler(online, demo)
    online.add(_batch(0, 10))
    demo.add(_batch(1000, 3))
    assert not mix.ready()
    demo.add(_batch(1003, 3))
    assert mix.ready()
    ids = mix.sample(9)["obs"][:, 0]
    assert (ids[:5] < 1000).all() and (ids[5:] >= 1000).all()


def test_trajectory_transitions_is_time_major() -> None:
    t, e, c, d = 3, 2, 2, 1
    traj = {
        "obs": torch.arange(t * e, dtype=torch.float32).reshape(t, e, 1),
        "next_obs": torch.arange(t * e, dtype=torch.float32).reshape(t, e, 1) + 0.5,
        "actions": torch.zeros(t, e, c, d),
        "rewards": torch.ones(t, e, c, dtype=torch.float64),
        "terminations": torch.zeros(t, e, c, dtype=torch.uint8),
        "prev_values": torch.zeros(t + 1, e, 1),
    }
    out = trajectory_transitions(traj)
    assert out["obs"][:, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert out["rewards"].dtype == torch.float32 and out["terminations"].dtype == torch.bool
    assert set(out) == {"obs", "next_obs", "actions", "rewards", "terminations"}
    del traj["next_obs"]
    with pytest.raises(ValueError, match="collect_transitions"):
        trajectory_transitions(traj)
