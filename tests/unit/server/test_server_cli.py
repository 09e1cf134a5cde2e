"""`embedserve serve` option parsing (the server itself is exercised in tests/integration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedserve.cli import build_parser, main
from embedserve.models.default import DEFAULT_MODEL_NAME, default_model_path
from embedserve.server.cli import _settings


def test_options_become_settings_and_api_keys_merge_with_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EMBEDSERVE_API_KEY", "env-1, env-2")
    args = build_parser().parse_args(
        ["serve", "--model", "/m/qwen3", "--api-key", "cli", "--warmup-lengths", "8,64",
         "--max-num-batched-tokens", "512", "--max-queued-tokens", "9000"]
    )  # fmt: skip
    s = _settings(args)
    assert s.api_keys == ("cli", "env-1", "env-2")
    assert s.warmup_lengths == (8, 64)
    assert s.max_queued_tokens == 9000
    assert s.engine.max_num_batched_tokens == 512
    assert s.model_name == "qwen3"


def test_bucket_and_compile_options_reach_the_engine() -> None:
    plain = _settings(build_parser().parse_args(["serve"])).engine
    assert (plain.token_buckets, plain.compile_backend) == (False, None)
    args = build_parser().parse_args(["serve", "--token-buckets", "--compile", "eager"])
    kwargs = _settings(args).engine
    assert (kwargs.token_buckets, kwargs.compile_backend) == (True, "eager")
    assert plain.deterministic is False
    det = _settings(build_parser().parse_args(["serve", "--deterministic"])).engine
    assert det.deterministic is True


def test_the_default_model_is_served_under_its_model_name() -> None:
    default = _settings(build_parser().parse_args(["serve"]))  # no --model: the bundled MiniLM
    assert default.served_model_name == DEFAULT_MODEL_NAME
    assert Path(default.model) == default_model_path()
    assert _settings(build_parser().parse_args(["serve", "--model", "/m/qwen3"])).served_model_name is None


@pytest.mark.parametrize("bad", [["--warmup-lengths", "16,0"], ["--max-queued-requests", "x"], ["--port"]])
def test_bad_options_are_refused_by_the_parser(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--model", "m", *bad])
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_inconsistent_bounds_exit_2_before_loading_anything(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["serve", "--model", "/nonexistent", "--max-queued-requests", "4", "--max-inputs-per-request", "8"]
    )
    assert rc == 2
    assert "could never be admitted" in capsys.readouterr().err
