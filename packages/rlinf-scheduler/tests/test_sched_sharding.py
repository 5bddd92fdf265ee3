from __future__ import annotations

import pytest
from rlinf_scheduler import peer_slices, shard_bounds


@pytest.mark.parametrize("total", [4, 8, 12, 24])
@pytest.mark.parametrize("src_ws", [1, 2, 4])
@pytest.mark.parametrize("dst_ws", [1, 2, 4])
def test_peer_slices_cover_and_agree(total: int, src_ws: int, dst_ws: int) -> None:
    if total % src_ws or total % dst_ws:
        with pytest.raises(ValueError, match="divide"):
            peer_slices(total, 0, src_ws, dst_ws)
        return
    # Every row is sent by exactly one source and received by exactly one destination, and both sides
    # agree on which global rows each (source, destination) pair exchanges.
    sent: dict[tuple[int, int], list[int]] = {}
    for src in range(src_ws):
        base = src * total // src_ws
        covered = []
        for dst, lo, hi in peer_slices(total, src, src_ws, dst_ws):
            sent[(src, dst)] = list(range(base + lo, base + hi))
            covered += list(range(lo, hi))
        assert covered == list(range(total // src_ws))
    received: dict[tuple[int, int], list[int]] = {}
    for dst in range(dst_ws):
        base = dst * total // dst_ws
        for src, lo, hi in peer_slices(total, dst, dst_ws, src_ws):
            received[(src, dst)] = list(range(base + lo, base + hi))
    assert sent == received
    assert sorted(r for rows in sent.values() for r in rows) == list(range(total))


def test_peer_slices_rejects_bad_rank() -> None:
    with pytest.raises(ValueError, match="rank 2"):
        peer_slices(8, 2, 2, 1)


def test_shard_bounds_cover_every_item_once() -> None:
    for n in range(0, 12):
        for world in range(1, 5):
            spans = [shard_bounds(n, r, world) for r in range(world)]
            assert [i for a, b in spans for i in range(a, b)] == list(range(n))
            sizes = [b - a for a, b in spans]
            assert max(sizes) - min(sizes) <= 1


def test_shard_bounds_rejects_bad_rank() -> None:
    with pytest.raises(ValueError, match="rank 3"):
        shard_bounds(8, 3, 2)
