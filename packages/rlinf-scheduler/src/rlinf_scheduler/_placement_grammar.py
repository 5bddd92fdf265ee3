"""The ``component_placement`` value grammar: ``resource_ranks[:process_ranks][, ...]``.

Pure text → ranks parsing; it knows how many resources exist but nothing about nodes (see ``_placement.py``).

Grammar (whitespace around tokens is ignored)::

    placement := segment ("," segment)*
    segment   := resources [":" processes]
    resources := "all" | INT | INT "-" INT        (inclusive range)
    processes := INT | INT "-" INT

Rules: segments are ascending and disjoint in resources; process ranks are continuous from 0 across segments
(an omitted process part continues with one process per resource); in a segment the number of processes divides
the number of resources (each process gets a contiguous block) or the number of resources divides the number of
processes (consecutive processes share one resource).
"""

from __future__ import annotations

import re

import attrs

__all__ = ["PlacementSegment", "parse_placement", "segments_to_process_resources"]

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


@attrs.frozen
class PlacementSegment:
    """One ``resource_ranks:process_ranks`` segment after parsing.

    Attributes:
        text: The segment as written (stripped), for error messages.
        resources: Resource ranks, ascending and contiguous.
        processes: Process ranks, ascending and contiguous.
    """

    text: str
    resources: tuple[int, ...]
    processes: tuple[int, ...]


def _parse_range(token: str, *, full: str, what: str) -> tuple[int, int]:
    compact = re.sub(r"\s+", "", token)
    match = _RANGE_RE.match(compact)
    if match is None:
        raise ValueError(
            f"placement {full!r}: {what} {token.strip()!r} is not 'all', an integer >= 0 or an 'a-b' range"
        )
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) is not None else start
    if end < start:
        raise ValueError(f"placement {full!r}: {what} range {compact!r} ends before it starts")
    return start, end


def parse_placement(
    text: str | int, *, num_resources: int, resource_name: str = "resource"
) -> list[PlacementSegment]:
    """Parse a placement text into segments, checking every grammar rule.

    Args:
        text: The placement value, e.g. ``"0-3"``, ``"all"``, ``"0-1:0-3,3-5,7-10:7-14"`` or an int.
        num_resources: How many resources (accelerators, hardware units or nodes) the target node group has;
            ``all`` means ``0..num_resources-1`` and larger ranks are errors.
        resource_name: Word used for resources in error messages (e.g. ``"accelerator"``, ``"node"``).

    Returns:
        The segments in order.

    Raises:
        ValueError: On any violation; the message quotes ``text`` and the offending part.

    Example:
        >>> [(s.resources, s.processes) for s in parse_placement("0-1:0-3,3", num_resources=8)]
        [((0, 1), (0, 1, 2, 3)), ((3,), (4,))]
    """
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise ValueError(f"placement {text!r}: expected a text such as '0-3', 'all' or '0-1:0-3', or an int")
    full = str(text)
    if not full.strip():
        raise ValueError(f"placement {full!r}: empty placement")
    segments: list[PlacementSegment] = []
    next_process = 0
    last_resource = -1
    for raw in full.split(","):
        seg = raw.strip()
        if not seg:
            raise ValueError(f"placement {full!r}: empty segment (stray ',')")
        parts = seg.split(":")
        if len(parts) > 2:
            raise ValueError(
                f"placement {full!r}: segment {seg!r} has more than one ':' (expected resource_ranks[:process_ranks])"
            )
        res_text = parts[0].strip()
        if res_text == "all":
            if num_resources <= 0:
                raise ValueError(f"placement {full!r}: 'all' selects no {resource_name}: none are available")
            r_start, r_end = 0, num_resources - 1
        else:
            r_start, r_end = _parse_range(res_text, full=full, what=f"{resource_name} ranks")
        if r_end >= num_resources:
            available = f"0-{num_resources - 1}" if num_resources > 0 else "none"
            raise ValueError(
                f"placement {full!r}: {resource_name} rank {r_end} in segment {seg!r} is out of range "
                f"({num_resources} {resource_name}(s) available: {available})"
            )
        if r_start <= last_resource:
            raise ValueError(
                f"placement {full!r}: segment {seg!r} is not ascending and disjoint: its {resource_name} ranks start at "
                f"{r_start} but the previous segment ends at {last_resource}"
            )
        resources = tuple(range(r_start, r_end + 1))
        if len(parts) == 2:
            proc_text = parts[1].strip()
            if proc_text == "all":
                raise ValueError(f"placement {full!r}: process ranks cannot be 'all' (segment {seg!r})")
            p_start, p_end = _parse_range(proc_text, full=full, what="process ranks")
            if p_start != next_process:
                raise ValueError(
                    f"placement {full!r}: process ranks must be continuous from 0 across segments: segment {seg!r} "
                    f"starts at process {p_start}, expected {next_process}"
                )
            processes = tuple(range(p_start, p_end + 1))
        else:
            processes = tuple(range(next_process, next_process + len(resources)))
        n_res, n_proc = len(resources), len(processes)
        if n_proc % n_res != 0 and n_res % n_proc != 0:
            raise ValueError(
                f"placement {full!r}: in segment {seg!r}, {n_proc} process(es) and {n_res} {resource_name}(s) do not "
                f"divide each other (the process count must be a multiple or a divisor of the {resource_name} count)"
            )
        segments.append(PlacementSegment(text=seg, resources=resources, processes=processes))
        next_process = processes[-1] + 1
        last_resource = r_end
    return segments


def segments_to_process_resources(segments: list[PlacementSegment]) -> list[tuple[int, ...]]:
    """Map each process rank to its resource ranks.

    Args:
        segments: Output of :func:`parse_placement`.

    Returns:
        ``out[p]`` = resource ranks of process ``p`` (ascending); ``len(out)`` is the world size.

    Example:
        >>> segments_to_process_resources(parse_placement("0-3:0-1", num_resources=4))
        [(0, 1), (2, 3)]
        >>> segments_to_process_resources(parse_placement("0-1:0-3", num_resources=2))
        [(0,), (0,), (1,), (1,)]
    """
    out: list[tuple[int, ...]] = []
    for seg in segments:
        n_res, n_proc = len(seg.resources), len(seg.processes)
        if n_res >= n_proc:
            block = n_res // n_proc
            out.extend(seg.resources[i * block : (i + 1) * block] for i in range(n_proc))
        else:
            share = n_proc // n_res
            out.extend((seg.resources[i // share],) for i in range(n_proc))
    return out
