"""`NAME?key=value&key=value` specs (backends and datasets) and the tool's error type."""

from __future__ import annotations

from collections.abc import Iterable

from embedserve.embedders.errors import SourceError
from embedserve.embedders.spec import parse_count, split_query

# The parity run cannot proceed (bad spec, missing data, unusable backend): exit code 2. A vector
# source's failure is one, so both are one type.
ParityError = SourceError


class Options:
    """Typed access to a spec's options; `finish()` rejects any option nobody asked for."""

    def __init__(self, owner: str, raw: dict[str, str]) -> None:
        self.owner = owner
        self._raw = dict(raw)
        self._used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self._raw

    def text(self, key: str, default: str | None = None) -> str | None:
        self._used.add(key)
        return self._raw.get(key, default)

    def integer(self, key: str, default: int | None = None) -> int | None:
        value = self.text(key)
        if value is None:
            return default
        try:
            return parse_count(value)
        except ValueError:
            raise ParityError(f"{self.owner}: option {key}={value!r} is not an integer") from None

    def flag(self, key: str, default: bool | None = None) -> bool | None:
        value = self.text(key)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ParityError(f"{self.owner}: option {key}={value!r} is not a boolean (true/false)")

    def integers(self, key: str, default: list[int]) -> list[int]:
        """A list such as `256,1024,16K` (also `:`-separated, which survives `--dataset a,b`)."""
        value = self.text(key)
        if value is None:
            return list(default)
        try:
            out = [parse_count(v) for v in value.replace(":", ",").split(",") if v.strip()]
        except ValueError:
            raise ParityError(f"{self.owner}: option {key}={value!r} is not a list of integers") from None
        if not out or min(out) < 1:
            raise ParityError(f"{self.owner}: option {key}={value!r} must list positive integers")
        return out

    def rest(self) -> dict[str, str]:
        """Options nobody asked for (marked as used)."""
        extra = {k: v for k, v in self._raw.items() if k not in self._used}
        self._used.update(extra)
        return extra

    def finish(self, also_known: Iterable[str] = ()) -> None:
        unknown = sorted(set(self._raw) - self._used)
        if unknown:
            known = ", ".join(sorted(self._used | set(also_known))) or "none"
            raise ParityError(f"{self.owner}: unknown option(s) {', '.join(unknown)}; known: {known}")


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`head?k=v&k2=v2` -> (`head`, {k: v, k2: v2}); repeated keys are an error."""
    head, _, query = spec.partition("?")
    return head, split_query(query, spec)


def split_dataset_list(values: list[str]) -> list[str]:
    """`--dataset a,b?lengths=256,1024` -> [`a`, `b?lengths=256,1024`].

    A comma starts a new dataset unless the next piece begins with a digit (then it continues
    the previous option's list), so numeric lists need no quoting.
    """
    out: list[str] = []
    for value in values:
        for piece in value.split(","):
            if not piece:
                continue
            if out and piece[0].isdigit():
                out[-1] += "," + piece
            else:
                out.append(piece)
    return out
