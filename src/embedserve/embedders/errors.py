"""The vector sources' errors: a spec that does not parse, a source that cannot be opened or used."""

from __future__ import annotations

from embedserve.errors import EmbedServeError, InvalidInputError


class SourceError(EmbedServeError):
    """A vector source cannot be opened or used (missing model, refused request, bad reply)."""


class SpecError(SourceError, InvalidInputError):
    """A source spec that does not parse: unknown kind, unknown option, a value of the wrong type."""
