"""The shared spec grammar (embedders/spec.py): one parse for parity, bench and index, engine options
reaching the engine from parity and bench specs, one error naming the accepted keys, `hf:` as
transformers with the directory's pooling."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.bench.http_target import HttpSession
from embedserve.bench.target import parse_target
from embedserve.bench.targets import open_target
from embedserve.cli import build_parser
from embedserve.embedders import open_source
from embedserve.embedders.errors import SourceError, SpecError
from embedserve.embedders.http import Endpoint, api_base
from embedserve.embedders.scorers import open_scorer
from embedserve.embedders.spec import ENGINE_SURFACE, KEYS, TOOLS, accepted, parse_spec
from embedserve.embedders.transformers import TransformersSource, read_pooling
from embedserve.engine.options import NOT_OFFERED, OPTION_NAMES, EngineOptions
from embedserve.errors import InvalidInputError
from embedserve.index.commands import embedder_spec
from embedserve.index.embedder import EmbedderSpec
from embedserve.index.errors import StoreError
from embedserve.parity.backends import open_backend
from embedserve.parity.options import ParityError


def _parsed(text: str, tool: str) -> tuple[object, ...]:
    s = parse_spec(text, tool)
    engine = s.engine_options() if s.kind == "engine" else None
    return s.kind, s.location, s.options, s.extra, s.name, engine


@pytest.mark.parametrize(
    "text",
    [
        "engine:{d}?dtype=bfloat16&max_num_seqs=8&deterministic=1&layer_major_tokens=0",
        "engine:{d}?max_model_len=16K&pooling=mean&normalize=0",
        "hf:{d}",
        "st:{d}",
        "http://h:1/v1?model=m&api_key_env=KEY&truncate=end",
    ],
)
def test_the_same_spec_parses_the_same_in_every_tool(tmp_path: Path, text: str) -> None:
    spec = text.format(d=tmp_path)
    first = _parsed(spec, "parity")
    assert all(_parsed(spec, tool) == first for tool in ("bench", "index"))
    assert parse_target(spec) == parse_spec(spec, "bench")  # bench's parser is the shared one


def test_engine_options_are_typed_by_the_engine_options(tmp_path: Path) -> None:
    s = parse_spec(f"engine:{tmp_path}?deterministic=yes&max_model_len=16K&normalize=0", "parity")
    assert s.engine_options() == EngineOptions(deterministic=True, max_model_len=16384, normalize=False)
    assert s.engine_options(max_num_batched_tokens=64).max_num_batched_tokens == 64
    assert s.typed_options() == {"deterministic": True, "max_model_len": 16384, "normalize": False}
    assert parse_spec(f"st:{tmp_path}?batch_size=4", "parity").typed_options() == {"batch_size": 4}


@pytest.mark.parametrize("tool", TOOLS)
def test_an_unknown_key_gets_one_error_naming_the_accepted_keys(tmp_path: Path, tool: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(f"engine:{tmp_path}?poling=mean&deterministic=1", tool)
    message = str(info.value)
    assert "unknown option(s) poling;" in message and message.count("unknown option") == 1
    listed = message.split("accepted: ", 1)[1].split(", ")
    assert listed == accepted(tool, "engine")
    assert {"pooling", "deterministic", "dtype"} <= set(listed)
    assert set(listed) - {k for k in KEYS} <= set(OPTION_NAMES)


def test_refusals_say_why(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match=r"max_num_batched_tokens \(bench runs one engine per"):
        parse_target(f"engine:{tmp_path}?max_num_batched_tokens=64")
    parse_spec(f"engine:{tmp_path}?max_num_batched_tokens=64", "parity")  # parity offers it
    with pytest.raises(ParityError, match=r"pid \(pid: bench only\)"):
        open_backend("http://h:1?pid=3")
    with pytest.raises(SpecError, match=r"option deterministic must be one of 1/true"):
        parse_spec(f"engine:{tmp_path}?deterministic=maybe", "bench")
    with pytest.raises(SpecError, match="must be an integer >= 0"):
        parse_spec("http://h:1?retries=-1", "parity")
    assert parse_spec("http://h:1?api_key=s3cret&model=m", "parity").shown == "http://h:1?model=m"


def test_engine_options_reach_the_engine_from_parity_and_bench(qwen3_dir: Path) -> None:
    text = f"engine:{qwen3_dir}?deterministic=1&max_num_seqs=3&pooling=mean"
    parity = open_backend(text)
    bench = open_target(parse_target(text), token_budget=512)
    engines = [parity.engine, bench.engine]  # type: ignore[attr-defined]
    try:
        for engine in engines:
            cfg = engine.config
            assert cfg.scheduler.deterministic_chunk is not None and cfg.scheduler.max_num_seqs == 3
            assert cfg.pooling.method.value == "mean"
        assert engines[1].config.scheduler.max_num_batched_tokens == 512  # bench's --token-budget value
        assert "-det" in parity.describe()["backend_profile"]
        vector = asyncio.run(bench.embed("hello there", "online")).vector
        np.testing.assert_array_equal(vector, parity.embed(["hello there"], "")[0])
    finally:
        parity.close()
        asyncio.run(bench.aclose())


def test_hf_is_transformers_with_the_directory_pooling(qwen3_dir: Path, qwen2_dir: Path) -> None:
    assert read_pooling(qwen3_dir) == ("lasttoken", True)
    assert read_pooling(qwen2_dir) == ("mean", True)
    texts = ["a short text", "a somewhat longer text with more words in it than the first"]
    for model in (qwen3_dir, qwen2_dir):
        hf = open_source(parse_spec(f"hf:{model}", "parity"))
        st = open_source(parse_spec(f"sentence-transformers:{model}", "parity"))
        try:
            assert isinstance(hf, TransformersSource) and hf.describe()["backend_profile"].startswith(
                "transformers/"
            )
            got, want = hf.embed(texts, "Q: "), st.embed(texts, "Q: ")
            cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
            assert cos.min() >= 0.99999, cos
            ids = [(5, 6, 7, 8)]
            assert float((hf.embed(ids, "") * st.embed(ids, "")).sum()) >= 0.99999
        finally:
            hf.close()
            st.close()


def test_hf_without_modules_json_needs_its_pooling_spelled_out(qwen3_dir: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(qwen3_dir, bare)
    (bare / "modules.json").unlink()
    with pytest.raises(SourceError, match=r"pass \?pooling="):
        open_source(parse_spec(f"hf:{bare}", "bench"))
    explicit = open_source(parse_spec(f"hf:{bare}?pooling=lasttoken&normalize=1", "bench"))
    reference = open_source(parse_spec(f"hf:{qwen3_dir}", "bench"))
    np.testing.assert_allclose(explicit.embed(["x y"], ""), reference.embed(["x y"], ""), atol=1e-6)
    (bare / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(SourceError, match="module Dense is not reproduced here"):
        read_pooling(bare)


def _index_spec(*argv: str) -> EmbedderSpec:
    args = build_parser().parse_args(["search", "q", *argv])
    return embedder_spec(args)


def test_index_takes_the_same_specs(qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _index_spec(
        "--embedder", f"engine:{qwen3_dir}?max_model_len=128&deterministic=1", "--dtype", "bfloat16"
    )
    assert spec.model == str(qwen3_dir) and spec.endpoint is None
    assert spec.engine == EngineOptions(dtype="bfloat16", max_model_len=128, deterministic=True)
    monkeypatch.setenv("INDEX_KEY", "k1")
    spec = _index_spec(
        "--embedder", f"http://h:1/v1/embeddings?model=m&api_key_env=INDEX_KEY&tokenizer={qwen3_dir}"
    )
    assert (spec.endpoint, spec.api_key, spec.endpoint_model, spec.tokenizer) == (
        "http://h:1/v1",
        "k1",
        "m",
        str(qwen3_dir),
    )
    assert spec.model is None
    with pytest.raises(StoreError, match="use engine: or http://"):
        _index_spec("--embedder", f"hf:{qwen3_dir}")
    with pytest.raises(StoreError, match=r"unknown option\(s\) truncate; accepted: model, api_key_env"):
        _index_spec("--embedder", "http://h:1?truncate=end")
    with pytest.raises(StoreError, match="pass --embedder or --endpoint, not both"):
        _index_spec("--embedder", "http://h:1", "--endpoint", "http://h:2")
    with pytest.raises(SpecError, match=r"unknown option\(s\) pid \(pid: bench only\)"):
        _index_spec("--embedder", "http://h:1?pid=4")
    with Engine.from_pretrained(
        qwen3_dir, _index_spec("--embedder", f"engine:{qwen3_dir}?deterministic=on").engine
    ) as engine:
        assert engine.config.scheduler.deterministic_chunk is not None


def _sample(field: dataclasses.Field[object]) -> tuple[str, object]:
    """A non-default value for an engine option, as typed in a spec and as parsed."""
    hint = str(typing.get_type_hints(EngineOptions)[field.name])
    if field.metadata["choices"]:
        choice = next(c for c in field.metadata["choices"] if c != field.default)
        return choice, choice
    if "bool" in hint:
        return ("0", False) if field.default is True else ("1", True)
    if "int" in hint:
        return "3", 3
    if "float" in hint:
        return "0.5", 0.5
    if "tuple" in hint:  # a list: comma-separated
        return "a=/x,b=/y", ("a=/x", "b=/y")
    return "somewhere", "somewhere"


@pytest.mark.parametrize("tool", ["parity", "bench"])
def test_every_engine_option_works_in_a_spec_or_is_refused_with_a_reason(tmp_path: Path, tool: str) -> None:
    refused = NOT_OFFERED[ENGINE_SURFACE[tool]]
    for field in dataclasses.fields(EngineOptions):
        text, value = _sample(field)
        spec = f"engine:{tmp_path}?{field.name}={text}"
        if field.name in refused:
            with pytest.raises(SpecError, match=re.escape(refused[field.name])):
                parse_spec(spec, tool)
            continue
        assert getattr(parse_spec(spec, tool).engine_options(), field.name) == value, field.name


def test_rerank_specs_share_the_grammar(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unknown option\(s\) poling; accepted: .*deterministic"):
        open_scorer(f"engine:{tmp_path}?poling=x")
    with pytest.raises(SpecError, match=r"batch_tokens: parity only"):
        open_scorer(f"st:{tmp_path}?batch_tokens=4")


def test_the_grammar_is_documented_once() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "specs.md").read_text(encoding="utf-8")
    assert [k for k in KEYS if f"`{k}`" not in doc] == []


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://h:1", "http://h:1/v1"),
        ("http://h:1/v1/", "http://h:1/v1"),
        ("http://h:1/v1/embeddings?x=1", "http://h:1/v1"),
        ("http://h:1/embeddings", "http://h:1"),
    ],
)
def test_an_endpoint_url_means_the_same_in_every_tool(url: str, base: str) -> None:
    assert api_base(url) == base
    assert Endpoint(parse_spec(url, "parity")).url == base + "/embeddings"
    assert HttpSession(parse_target(url)).url == base + "/embeddings"
