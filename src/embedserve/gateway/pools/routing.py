"""Which pool each input goes to: a pure function of token counts, the route and pool state.

The smallest pool whose `max_tokens` fits wins (ties: the route's order), so a 20-token query
never waits behind 16K-token documents in the long pool. The other pools that fit follow in
the route's order: they are the fallbacks when a pool is saturated or not ready. A pool smaller
than an input's primary pool never fits it (else it would be the primary), so every input with
the same primary pool has the same fallbacks, and a group can fall back as one request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from embedserve.errors import EmbedServeError, InputTooLongError
from embedserve.gateway.pools.config import RouteConfig


class NoPoolAvailable(EmbedServeError):
    """Every pool that could take an input has no upstream in rotation (HTTP 503)."""


@dataclass(frozen=True)
class Placement:
    candidates: tuple[str, ...]  # pools to try, in order (available ones only)
    preferred: str  # the pool it would go to if every pool were available

    @property
    def fallback(self) -> bool:
        return self.candidates[0] != self.preferred


def place_inputs(
    token_counts: Sequence[int],
    route: RouteConfig,
    limits: Mapping[str, int],
    available: Set[str],
    truncate: str,
) -> list[Placement]:
    """One Placement per input, or InputTooLongError (with the input's index) / NoPoolAvailable."""
    rank = {name: (limits[name], i) for i, name in enumerate(route.order)}
    longest = max(limits[name] for name in route.order)
    out: list[Placement] = []
    for index, n in enumerate(token_counts):
        over = n > longest
        if over and truncate == "error":
            raise InputTooLongError(n, longest, index=index)
        # Over-long inputs (truncate end/start) go to the longest pools, which cut the least.
        fits = [name for name in route.order if (limits[name] == longest if over else limits[name] >= n)]
        preferred = min(fits, key=rank.__getitem__)
        ordered = [preferred, *(name for name in fits if name != preferred)]
        candidates = tuple(name for name in ordered if name in available)
        if not candidates:
            raise NoPoolAvailable(
                f"input {index} ({n} tokens): no upstream is ready in pools {ordered} "
                f"of the {route.traffic_class!r} route"
            )
        out.append(Placement(candidates, preferred))
    return out


def group_placements(placements: Sequence[Placement]) -> list[tuple[tuple[str, ...], list[int]]]:
    """(candidates, input indices) per distinct candidate list, in first-seen order."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, p in enumerate(placements):
        groups.setdefault(p.candidates, []).append(i)
    return list(groups.items())
