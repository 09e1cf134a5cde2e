"""Exceptions the engine raises; servers map them to HTTP status codes."""

from __future__ import annotations


class EmbedServeError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidInputError(EmbedServeError, ValueError):
    """The caller sent something the engine can never embed (HTTP 400)."""


# How each body shape asks to cut an over-long input: the hint of its 400
API_REMEDY = "pass truncate='end' / 'start'"  # OpenAI-style bodies (ours, vLLM's)
TEI_REMEDY = "pass truncate: true"  # TEI's bool
COHERE_REMEDY = "pass truncate 'END' / 'START'"  # Cohere's /v2/embed


class InputTooLongError(InvalidInputError):
    """An input exceeds the token limit under the `error` truncation policy (HTTP 400)."""

    def __init__(
        self, num_tokens: int, limit: int, index: int | None = None, remedy: str = API_REMEDY
    ) -> None:
        where = "" if index is None else f"input {index}: "
        super().__init__(
            f"{where}{num_tokens} tokens exceed the limit of {limit} tokens; shorten the input or {remedy}"
        )
        self.num_tokens = num_tokens
        self.limit = limit
        self.index = index

    def with_remedy(self, remedy: str) -> InputTooLongError:
        """The same error worded for another interface (e.g. a command line's option)."""
        return InputTooLongError(self.num_tokens, self.limit, self.index, remedy)


class ImageTooLargeError(InvalidInputError):
    """An image exceeds the decoded pixel limit (HTTP 413)."""


class ModelLoadError(EmbedServeError):
    """A model directory or file cannot be loaded (clear reason in the message)."""


class EngineDeadError(EmbedServeError):
    """The engine loop stopped; no further requests can be served (HTTP 503)."""


class InternalEngineError(EmbedServeError):
    """An invariant broke while computing a request: never returned as a vector (HTTP 500)."""


class SettingsError(EmbedServeError, ValueError):
    """An environment switch holds a value it does not accept (the message names both)."""
