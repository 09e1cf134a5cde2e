"""The pure routing function: smallest fitting pool, route order for ties and fallback."""

from __future__ import annotations

import pytest

from embedserve.errors import InputTooLongError
from embedserve.gateway.pools.config import RouteConfig
from embedserve.gateway.pools.routing import NoPoolAvailable, Placement, group_placements, place_inputs

LIMITS = {"short": 4096, "long": 16384, "batch-long": 16384, "tiny": 512}
ONLINE = RouteConfig("online", ("short", "long"))
BATCH = RouteConfig("batch", ("batch-long", "long"))
ALL = set(LIMITS)


def candidates(
    counts: list[int], route: RouteConfig, available: set[str] = ALL, truncate: str = "error"
) -> list:
    return [p.candidates for p in place_inputs(counts, route, LIMITS, available, truncate)]


def test_smallest_fitting_pool_wins_and_bigger_ones_follow_in_route_order() -> None:
    assert candidates([20, 4096, 4097, 16384], ONLINE) == [
        ("short", "long"),
        ("short", "long"),  # exactly max_tokens fits
        ("long",),
        ("long",),
    ]


def test_smallest_wins_even_when_listed_last() -> None:
    route = RouteConfig("online", ("long", "short", "tiny"))
    assert candidates([100, 1000, 5000], route) == [("tiny", "long", "short"), ("short", "long"), ("long",)]


def test_equal_limits_keep_the_route_order() -> None:
    assert candidates([20, 10000], BATCH) == [("batch-long", "long"), ("batch-long", "long")]


def test_unavailable_pool_is_skipped_and_marked_as_fallback() -> None:
    placed = place_inputs([20, 9000], ONLINE, LIMITS, {"long"}, "error")
    assert placed == [Placement(("long",), "short"), Placement(("long",), "long")]
    assert [p.fallback for p in placed] == [True, False]


def test_no_available_pool_names_the_input() -> None:
    with pytest.raises(NoPoolAvailable, match=r"input 1 \(9000 tokens\).*\['long'\]"):
        place_inputs([20, 9000], ONLINE, LIMITS, {"short"}, "error")


def test_over_long_input_is_refused_with_count_and_limit() -> None:
    with pytest.raises(InputTooLongError, match="input 2: 20000 tokens exceed the limit of 16384") as e:
        place_inputs([5, 6, 20000], ONLINE, LIMITS, ALL, "error")
    assert (e.value.num_tokens, e.value.limit) == (20000, 16384)


@pytest.mark.parametrize("truncate", ["end", "start"])
def test_over_long_input_with_truncation_goes_to_the_longest_pools(truncate: str) -> None:
    assert candidates([20000], BATCH, truncate=truncate) == [("batch-long", "long")]
    assert candidates([20000], RouteConfig("online", ("short",)), truncate=truncate) == [("short",)]


def test_groups_keep_first_seen_order_and_input_positions() -> None:
    placed = place_inputs([20, 9000, 30, 10000, 40], ONLINE, LIMITS, ALL, "error")
    assert group_placements(placed) == [(("short", "long"), [0, 2, 4]), (("long",), [1, 3])]
