"""One grammar for every tool that names a vector source (parity, bench, index); docs/specs.md.

    engine:PATH?key=value&...                 our engine, in this process (keys: EngineOptions' fields)
    sentence-transformers:PATH?...  (st:)     sentence-transformers: SentenceTransformer / CrossEncoder
    hf:PATH?...                               transformers, with the directory's pooling written out
    http(s)://HOST:PORT[/v1[/embeddings]]?... any OpenAI-compatible endpoint

A key means the same wherever it is accepted. `KEYS` declares each of the spec's own keys once,
with the tools and kinds that take it; an `engine:` spec's other keys are engine options, parsed
and typed by `EngineOptions.from_mapping` (engine/options.py). Every other key of an `http://`
spec is sent as a JSON field of each request. PATH may be the default model's name
(all-MiniLM-L6-v2): it stands for its installed copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from embedserve.embedders.errors import SpecError
from embedserve.engine.options import NOT_OFFERED, EngineOptions, offered_on
from embedserve.errors import ModelLoadError
from embedserve.models.default import resolve_model

# Who reads a spec. "rerank": reranker specs (embedders/scorers.py), in parity --task rerank and bench
# --scenario rerank alike.
TOOLS = ("parity", "bench", "index", "rerank")
KINDS = ("engine", "sentence-transformers", "hf", "http")
FORMS = "engine:PATH, sentence-transformers:PATH, hf:PATH or http(s)://HOST:PORT"
_ALIASES = {"st": "sentence-transformers"}
_REFS = ("sentence-transformers", "hf")
_HTTP = ("http",)
_READERS = ("parity", "bench", "rerank")  # the tools that run the references
# Each tool's surface in engine/options.py's NOT_OFFERED (index builds engines as its command line does).
ENGINE_SURFACE = {"parity": "parity", "bench": "bench", "index": "cli", "rerank": "parity"}


@dataclass(frozen=True)
class Key:
    type: type  # int, float or str
    help: str
    where: Mapping[str, tuple[str, ...]]  # tool -> the kinds that take the key there
    minimum: int = 1


KEYS: dict[str, Key] = {
    "name": Key(str, "the label in reports", {"bench": KINDS}),
    "batch_size": Key(
        int,
        "inputs per call (parity) / per padded batch (bench's FIFO batcher)",
        {"parity": KINDS, "bench": _REFS},
    ),
    "batch_tokens": Key(int, "padded tokens per call at most", {"parity": KINDS}),
    "dtype": Key(
        str, "the reference's dtype: float32 (default), bfloat16, float16", {t: _REFS for t in _READERS}
    ),
    "device": Key(str, "the reference's device: cpu (default), cuda, cuda:N", {t: _REFS for t in _READERS}),
    "pooling": Key(
        str,
        "hf: lasttoken, mean or cls when the directory has no modules.json",
        {"parity": ("hf",), "bench": ("hf",)},
    ),
    "normalize": Key(
        str,
        "hf: 1/0, L2-normalize when the directory has no modules.json",
        {"parity": ("hf",), "bench": ("hf",)},
    ),
    "output": Key(
        str,
        "lexical: BGE-M3's lexical weights (its sparse_linear.pt) instead of its dense vectors",
        {"parity": ("hf", "engine")},
    ),
    "model": Key(
        str, "model name to request (default: the only one /v1/models lists)", {t: _HTTP for t in TOOLS}
    ),
    "api_key_env": Key(str, "environment variable holding the bearer key", {t: _HTTP for t in TOOLS}),
    "api_key": Key(str, "the bearer key itself (never written to reports)", {t: _HTTP for t in TOOLS}),
    "tokenizer": Key(
        str, "a local model directory to count tokens / chunk with", {"parity": _HTTP, "index": _HTTP}
    ),
    "timeout": Key(
        float, "seconds per request (default 600)", {"parity": _HTTP, "bench": _HTTP, "rerank": _HTTP}
    ),
    "retries": Key(
        int, "retries on 429/503, honouring Retry-After (default 8)", {"parity": _HTTP}, minimum=0
    ),
    "max_length": Key(int, "the endpoint's longest input in tokens", {"parity": _HTTP}),
    "pid": Key(int, "the server's process id: its memory is sampled for peak memory", {"bench": _HTTP}),
    "priority": Key(str, "1: send embedserve's `priority` field (other servers reject it)", {"bench": _HTTP}),
    "queue_header": Key(
        str, "response header with the queue time in ms (default x-queue-time)", {"bench": _HTTP}
    ),
}


@dataclass(frozen=True)
class Spec:
    raw: str  # as typed
    tool: str  # parity | bench | index: decides which keys exist
    kind: str  # engine | sentence-transformers | hf | http
    location: str  # the model path (the default model resolved), or the URL without our keys
    options: dict[str, str] = field(
        default_factory=dict
    )  # our keys and engine options as typed, `name` aside
    extra: dict[str, str] = field(default_factory=dict)  # http: every other key, a JSON field of each request
    name: str = ""

    @property
    def model_dir(self) -> Path | None:
        return None if self.kind == "http" else Path(self.location)

    @property
    def has_budget_axis(self) -> bool:
        """The engine's token budget applies (bench's --token-budget axis); n/a for every other kind."""
        return self.kind == "engine"

    @property
    def shown(self) -> str:
        """The spec as reports show it: secrets removed."""
        return without_secrets(self.raw)

    def option(self, key: str, default: str | None = None) -> str | None:
        return self.options.get(key, default)

    def int_option(self, key: str, default: int | None = None) -> int | None:
        return parse_count(self.options[key]) if key in self.options else default

    def float_option(self, key: str, default: float) -> float:
        return float(self.options[key]) if key in self.options else default

    def engine_options(self, **overrides: Any) -> EngineOptions:
        """The engine options given (typed by engine/options.py), then `overrides` (the tool's own)."""
        return _engine_options(self.raw, self.tool, self.kind, self.options).replace(**overrides)

    def typed_options(self) -> dict[str, Any]:
        """Every option given, typed: engine options by EngineOptions, our keys by `KEYS`."""
        engine = self.engine_options() if self.kind == "engine" else None
        return {
            k: _typed(k, v) if _ours(k, self.tool, self.kind) else getattr(engine, k)
            for k, v in self.options.items()
        }


def parse_spec(text: str, tool: str) -> Spec:
    """A spec as `tool` reads it; a SpecError names what is wrong and what is accepted."""
    if text.startswith(("http://", "https://")):
        parts = urlsplit(text)
        query = split_query(parts.query, text)
        ours = {
            k: v for k, v in query.items() if k in KEYS and any("http" in ks for ks in KEYS[k].where.values())
        }
        extra = {k: v for k, v in query.items() if k not in ours}
        _check(text, tool, "http", ours)
        location = urlunsplit(parts._replace(query=urlencode(extra)))
        name = ours.pop("name", "") or _default_name("http", location, ours)
        return Spec(text, tool, "http", location, ours, extra, name)
    kind, sep, rest = text.partition(":")
    kind = _ALIASES.get(kind, kind)
    if not sep or kind not in KINDS or kind == "http":
        raise SpecError(f"spec {text!r}: unknown kind {kind!r}; expected {FORMS}")
    shown, _, qs = rest.partition("?")
    if not shown:
        raise SpecError(f"spec {text!r}: no model directory given")
    options = split_query(qs, text)
    _check(text, tool, kind, options)
    try:  # the default model's name (all-MiniLM-L6-v2) stands for its installed copy
        location = resolve_model(shown)
    except ModelLoadError as e:
        raise SpecError(f"spec {text!r}: {e}") from None
    path = Path(location)
    if not (path.is_dir() or (kind == "engine" and path.suffix == ".gguf" and path.is_file())):
        raise SpecError(f"spec {text!r}: {location} is not a directory")
    name = options.pop("name", "") or _default_name(kind, Path(shown).name, options)
    return Spec(text, tool, kind, location, options, {}, name)


def without_secrets(text: str) -> str:
    """A spec's text without its `api_key` (reports and command lines never hold one)."""
    head, _, query = text.partition("?")
    pairs = parse_qsl(query, keep_blank_values=True)
    if all(k != "api_key" for k, _ in pairs):
        return text
    kept = [(k, v) for k, v in pairs if k != "api_key"]
    return head + ("?" + urlencode(kept, safe="/:,") if kept else "")


def split_query(query: str, text: str) -> dict[str, str]:
    """`k=v&k2=v2` -> {k: v, k2: v2}; a key given twice is an error."""
    out: dict[str, str] = {}
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k in out:
            raise SpecError(f"{text!r}: option {k!r} given twice")
        out[k] = v
    return out


def parse_count(value: str) -> int:
    """`512`, `16K` / `16k` (x1024)."""
    v = value.strip()
    if v[-1:] in ("k", "K"):
        return int(v[:-1]) * 1024
    return int(v)


def accepted(tool: str, kind: str) -> list[str]:
    """The keys `tool` accepts on a `kind` spec (an http spec's other keys are JSON fields)."""
    ours = [k for k in KEYS if _ours(k, tool, kind)]
    return ours + list(offered_on(ENGINE_SURFACE[tool])) if kind == "engine" else ours


def _ours(key: str, tool: str, kind: str) -> bool:
    return key in KEYS and kind in KEYS[key].where.get(tool, ())


def _check(text: str, tool: str, kind: str, options: dict[str, str]) -> None:
    known = accepted(tool, kind)
    unknown = [k for k in options if k not in known]
    if unknown:
        raise SpecError(
            f"spec {text!r}: unknown option(s) {', '.join(unknown)}"
            + "".join(f" ({why})" for why in (_why(k, tool, kind) for k in unknown) if why)
            + f"; accepted: {', '.join(known)}"
        )
    for k, v in options.items():
        if _ours(k, tool, kind):
            _typed(k, v, text)
    if kind == "engine":
        try:
            _engine_options(text, tool, kind, options)
        except ValueError as e:
            raise SpecError(str(e)) from None


def _engine_options(text: str, tool: str, kind: str, options: Mapping[str, str]) -> EngineOptions:
    """The spec's keys that are not its own, typed as engine options for `tool`'s surface."""
    values = {k: _count_text(v) for k, v in options.items() if not _ours(k, tool, kind)}
    return EngineOptions.from_mapping(values, where=f"spec {text!r}", surface=ENGINE_SURFACE[tool])


def _why(key: str, tool: str, kind: str) -> str:
    if key in KEYS:
        users = [t for t, kinds in KEYS[key].where.items() if kind in kinds]
        return f"{key}: {' and '.join(users)} only" if users else f"{key}: not on {kind}: specs"
    return NOT_OFFERED[ENGINE_SURFACE[tool]].get(key, "") if kind == "engine" else ""


def _typed(key: str, value: str, text: str = "") -> Any:
    spec = KEYS[key]
    try:
        if spec.type is int:
            number = parse_count(value)
            if number < spec.minimum:
                raise ValueError(value)
            return number
        return spec.type(value)
    except ValueError:
        expected = {int: "a positive integer" if spec.minimum == 1 else "an integer >= 0", float: "a number"}
        raise SpecError(f"spec {text!r}: option {key}={value!r} must be {expected[spec.type]}") from None


def _count_text(value: str) -> str:
    """`16K` as the engine's options read counts (`16384`); anything else unchanged."""
    try:
        return str(parse_count(value)) if value[-1:] in ("k", "K") else value
    except ValueError:
        return value


def _default_name(kind: str, where: str, options: Mapping[str, str]) -> str:
    short = {"engine": "engine", "sentence-transformers": "st", "hf": "hf", "http": "http"}[kind]
    label = f"{short}:{where}"
    return f"{label}:{options['dtype']}" if "dtype" in options else label
