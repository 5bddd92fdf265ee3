"""Property tests of the placement grammar and strategies (hypothesis; pure, no Ray)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_scheduler import PackedPlacementStrategy, StaticClusterView, resolve_placement


@st.composite
def placements(draw: st.DrawFn) -> tuple[str, list[tuple[list[int], int]], int]:
    """A valid placement text, its segments as (resources, #processes), and the resources needed."""
    segments: list[tuple[list[int], int]] = []
    parts: list[str] = []
    next_res = 0
    next_proc = 0
    for _ in range(draw(st.integers(1, 4))):
        next_res += draw(st.integers(0, 3))  # gap
        n_res = draw(st.integers(1, 6))
        factor = draw(st.integers(1, 3))
        n_proc = draw(st.sampled_from([n_res * factor, max(1, n_res // factor)]))
        if n_res % n_proc and n_proc % n_res:
            n_proc = n_res
        res = list(range(next_res, next_res + n_res))
        res_text = f"{res[0]}-{res[-1]}" if n_res > 1 or draw(st.booleans()) else f"{res[0]}"
        explicit = n_proc != n_res or draw(st.booleans())
        if explicit:
            procs = f"{next_proc}-{next_proc + n_proc - 1}" if n_proc > 1 else f"{next_proc}"
            parts.append(f"{res_text}:{procs}")
        else:
            parts.append(res_text)
        segments.append((res, n_proc))
        next_res += n_res
        next_proc += n_proc
    return ",".join(parts), segments, next_res


@given(data=placements(), per_node=st.integers(1, 9), extra_nodes=st.integers(0, 2))
@settings(max_examples=300, deadline=None)
def test_grammar_invariants(
    data: tuple[str, list[tuple[list[int], int]], int], per_node: int, extra_nodes: int
) -> None:
    text, segments, needed = data
    num_nodes = -(-needed // per_node) + extra_nodes
    # Expected resources of each process, computed independently of the implementation.
    expected: list[list[int]] = []
    for res, n_proc in segments:
        if len(res) >= n_proc:
            k = len(res) // n_proc
            expected.extend(res[i * k : (i + 1) * k] for i in range(n_proc))
        else:
            m = n_proc // len(res)
            expected.extend([res[i // m]] for i in range(n_proc))
    crosses = any(len({r // per_node for r in rs}) > 1 for rs in expected)
    if crosses:
        with pytest.raises(ValueError, match=r"would span nodes") as info:
            resolve_placement({"c": text}, num_nodes=num_nodes, accelerators_per_node=per_node)
        assert repr(text) in str(info.value)
        return
    out = resolve_placement({"c": text}, num_nodes=num_nodes, accelerators_per_node=per_node)["c"]
    # ranks contiguous from 0, world size consistent
    assert [p.rank for p in out] == list(range(len(expected)))
    assert all(p.world_size == len(expected) for p in out)
    # each process is where the grammar says: global rank r -> node r // per_node, device r % per_node
    for p, rs in zip(out, expected, strict=True):
        assert list(p.resource_ranks) == rs
        assert p.node_rank == rs[0] // per_node
        assert list(p.local_accelerators) == [r % per_node for r in rs]
    # no device is used more than the grammar says: exclusive blocks once, shared devices n_proc/n_res times
    usage = Counter((p.node_rank, d) for p in out for d in p.local_accelerators)
    for res, n_proc in segments:
        for r in res:
            assert usage[(r // per_node, r % per_node)] == max(1, n_proc // len(res))
    assert sum(usage.values()) == sum(max(len(res), n_proc) for res, n_proc in segments)
    # local ranks count 0.. on each node in rank order; local world size is the per-node count
    by_node: dict[int, list[int]] = {}
    for p in out:
        by_node.setdefault(p.node_rank, []).append(p.local_rank)
    for node, local_ranks in by_node.items():
        assert local_ranks == list(range(len(local_ranks)))
        assert all(p.local_world_size == len(local_ranks) for p in out if p.node_rank == node)


@given(
    start=st.integers(0, 20),
    nhpp=st.integers(1, 4),
    stride=st.integers(1, 4),
    blocks=st.integers(1, 4),
)
@settings(max_examples=200, deadline=None)
def test_packed_strategy_uses_each_resource_once(start: int, nhpp: int, stride: int, blocks: int) -> None:
    end = start + nhpp * stride * blocks - 1
    strategy = PackedPlacementStrategy(start, end, num_hardware_per_process=nhpp, stride=stride)
    ranks = strategy.resource_ranks_per_process(end + 1)
    assert len(ranks) == blocks * stride
    assert sorted(itertools.chain.from_iterable(ranks)) == list(range(start, end + 1))
    for rs in ranks:
        assert len(rs) == nhpp
        assert all(b - a == stride for a, b in itertools.pairwise(rs))
    # resolved on a single big node, local devices equal the ranks
    view = StaticClusterView(num_nodes=1, accelerators=end + 1)
    assert [p.local_accelerators for p in strategy.get_placement(view)] == ranks


@given(text=st.text(alphabet="0123456789-:, al", max_size=12))
@settings(max_examples=300, deadline=None)
def test_arbitrary_text_is_resolved_or_rejected_with_its_quote(text: str) -> None:
    try:
        out = resolve_placement({"c": text}, num_nodes=2, accelerators_per_node=4)
    except ValueError as e:
        assert "component_placement['c']" in str(e)
        assert repr(text) in str(e) or repr(text.strip()) in str(e)
    else:
        assert [p.rank for p in out["c"]] == list(range(len(out["c"])))
