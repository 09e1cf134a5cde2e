"""EngineOptions is the one home of engine options: every field reaches every surface (the
command line, `engine:` specs, pools.yaml) or the surface says why not."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from embedserve.cli import build_parser
from embedserve.engine.builder import build_engine
from embedserve.engine.engine import Engine
from embedserve.engine.options import NOT_OFFERED, EngineOptions, OptionError
from embedserve.errors import ModelLoadError
from embedserve.gateway.pools.config import GatewayConfigError
from embedserve.scale.config import parse_scale_config

FIELDS = dataclasses.fields(EngineOptions)
HINTS = typing.get_type_hints(EngineOptions)


def sample(f: dataclasses.Field[Any]) -> Any:
    """A value of the field's type other than its default."""
    choices = f.metadata["choices"]
    if choices:
        return next(c for c in choices if c != f.default)
    hint = HINTS[f.name]
    if hint in (bool, bool | None):
        return f.default is not True  # True, or False for a tri-state None
    if hint in (int, int | None):
        return (f.default or 0) + 300  # above every minimum, and above max_tokens below
    if hint == float | None:
        return 0.5
    if hint == tuple[str, ...]:
        return ("a=/x", "b=/y")
    return "cuda:1" if f.name == "device" else "eager"


def text(value: Any) -> str:
    """The value as a spec or a pool key writes it (a list: comma-separated)."""
    return ",".join(value) if isinstance(value, tuple) else str(value).lower()


def cli_words(f: dataclasses.Field[Any]) -> list[str]:
    flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
    value = sample(f)
    if isinstance(value, bool):
        return [flag] if value else ["--no-" + flag[2:]]
    return [flag, *value] if isinstance(value, tuple) else [flag, str(value)]


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_every_option_is_on_the_command_line(f: dataclasses.Field[Any]) -> None:
    assert not NOT_OFFERED["cli"], "the command line offers every option"
    helptext = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()  # type: ignore[union-attr]
    assert cli_words(f)[0] in helptext
    for command in (["serve"], ["embed", "hi"], ["index", "docs/"], ["run-batch", "-i", "in", "-o", "out"]):
        args = build_parser().parse_args([*command, *cli_words(f)])
        assert getattr(EngineOptions.from_args(args), f.name) == sample(f), command


@pytest.mark.parametrize("surface", ["parity", "bench", "pools"])
@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_every_option_parses_from_text_or_says_why_not(surface: str, f: dataclasses.Field[Any]) -> None:
    written = text(sample(f))
    if f.name in NOT_OFFERED[surface]:
        with pytest.raises(OptionError, match=NOT_OFFERED[surface][f.name][:30]):
            EngineOptions.from_mapping({f.name: written}, where="spec", surface=surface)
        return
    options = EngineOptions.from_mapping({f.name: written}, where="spec", surface=surface)
    assert getattr(options, f.name) == sample(f)
    assert options.changed() == {f.name: sample(f)}


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.name)
def test_every_option_is_a_pool_key(f: dataclasses.Field[Any]) -> None:
    raw = {
        "model": "/models/m",
        "pools": {"short": {"max_tokens": 64, f.name: sample(f)}},
        "routes": [{"class": "online", "order": ["short"]}],
    }
    if f.name in NOT_OFFERED["pools"]:
        with pytest.raises(GatewayConfigError, match=f"pools.short: unknown engine option.*{f.name}"):
            parse_scale_config(raw)
        return
    (pool,) = parse_scale_config(raw).pools
    assert getattr(pool.engine, f.name) == sample(f)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_num_seq": "8"}, "unknown engine option.*max_num_seq.*accepted: dtype, device"),
        ({"deterministic": "maybe"}, "option deterministic must be one of 1/true"),
        ({"max_num_seqs": "eight"}, "option max_num_seqs must be an integer"),
        ({"max_num_seqs": "0"}, "option max_num_seqs must be an integer >= 1"),
        ({"dtype": "fp8"}, "option dtype must be one of float32, bfloat16, float16"),
        ({"max_num_seqs": True}, "option max_num_seqs must be an integer"),
        ({"max_num_batched_tokens": "512"}, "bench runs one engine per --token-budget value"),
        ({"gpu_memory_utilization": "0"}, r"must be a fraction in \(0, 1\], got 0.0"),
        ({"gpu_memory_utilization": float("inf")}, r"must be a fraction in \(0, 1\], got inf"),
        ({"device": ""}, "option device must not be empty"),
    ],
)
def test_bad_values_name_the_option(values: dict[str, object], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        EngineOptions.from_mapping(values, where="engine:DIR", surface="bench")


def test_keywords_are_the_fields(qwen3_dir: Path) -> None:
    with pytest.raises(TypeError, match=r"unknown engine option.*max_num_seq.*known: dtype"):
        Engine.from_pretrained(qwen3_dir, max_num_seq=8)
    options = EngineOptions(max_num_batched_tokens=512, deterministic=True)
    parts = build_engine(qwen3_dir, options, max_model_len=1024)  # keywords override the options
    sched, config = parts.config.scheduler, parts.config
    assert (sched.max_num_batched_tokens, sched.max_model_len, config.deterministic) == (512, 1024, True)


def test_refusals_come_before_any_weight_is_read(qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import embedserve.engine.load as load

    def no_weights(*args: object) -> None:
        raise AssertionError("weights were read for a refused configuration")

    monkeypatch.setattr(load, "build_model", no_weights)
    for refused, message in [
        ({"tensor_parallel_size": 2, "deterministic": True}, "deterministic is not supported with tensor"),
        ({"layer_major_tokens": -1}, "layer_major_tokens must be an integer >= 0"),
        ({"max_model_len": 10**7}, "exceeds max_position_embeddings"),
        ({"kv_cache_memory": 1}, "smaller than one KV block"),
    ]:
        with pytest.raises(ModelLoadError, match=message):
            build_engine(qwen3_dir, **refused)


def test_a_multimodal_model_never_runs_in_the_layer_major_lane(qwen3_vl_dir: Path) -> None:
    # The lane runs plain text rows (1-D positions, no vision rows): an image prompt there
    # would come out wrong, so a multimodal model keeps every prompt in the chunked path.
    parts = build_engine(qwen3_vl_dir, max_num_batched_tokens=256)
    assert parts.config.scheduler.layer_major_tokens is None and parts.core.lane is None
    with pytest.raises(ModelLoadError, match="layer_major_tokens is not available for multimodal"):
        build_engine(qwen3_vl_dir, layer_major_tokens=4096)


def test_what_a_model_cannot_split_is_named_before_options_that_do_not_split(tmp_path: Path) -> None:
    from tests.helpers.tiny_bert import build_encoder

    bert = build_encoder(tmp_path / "bert")
    with pytest.raises(ModelLoadError, match=r"applies to decoder models.*encoder"):
        build_engine(bert, tensor_parallel_size=2, token_buckets=True)
