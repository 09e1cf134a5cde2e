"""Length buckets in model tokens: the one definition the server, bench and parity share.

Buckets are half-open on the left: an input of n tokens falls in the bucket with lo < n <= hi,
so 1024 is "0-1K" and 1025 is "1K-4K". Short and long inputs are never averaged together.
"16K+" only exists so 32K-context models are not rejected.
"""

from __future__ import annotations

from embedserve.errors import InvalidInputError

# (name, lo, hi): tokens in (lo, hi].
BUCKETS: tuple[tuple[str, int, int], ...] = (
    ("0-1K", 0, 1024),
    ("1K-4K", 1024, 4096),
    ("4K-8K", 4096, 8192),
    ("8K-16K", 8192, 16384),
    ("16K+", 16384, 1 << 40),
)
BUCKET_NAMES = tuple(name for name, _, _ in BUCKETS)


def bucket_of(num_tokens: int) -> str:
    if num_tokens < 1:
        raise InvalidInputError(f"an input has at least one token, got {num_tokens}")
    for name, lo, hi in BUCKETS:
        if lo < num_tokens <= hi:
            return name
    raise AssertionError("unreachable: the last bucket is unbounded")


def bucket_range(name: str) -> tuple[int, int]:
    """(lo, hi] token range of a bucket name such as "1K-4K"."""
    for n, lo, hi in BUCKETS:
        if n == name:
            return lo, hi
    raise InvalidInputError(f"unknown length bucket {name!r}; known: {', '.join(BUCKET_NAMES)}")
