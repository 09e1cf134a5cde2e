"""LoRA adapters on one base model (lora/, engine/adapters.py) against PEFT itself (transformers +
peft, float32): every adapter and the base in one mixed batch, chunked, layer-major and preempted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.config import PoolingMethod
from embedserve.engine.adapters import UnknownAdapterError, view
from embedserve.engine.builder import build_engine
from embedserve.errors import ModelLoadError
from embedserve.lora import rows as lora_rows
from embedserve.request import EmbedParams, Priority, Request
from embedserve.worker import model_runner
from tests.helpers.engine_calls import submit
from tests.helpers.preemption import preempted_vector
from tests.helpers.reference import cosine, random_ids
from tests.helpers.tiny_bert import build_encoder
from tests.helpers.tiny_lora import DECODER_TARGETS, ENCODER_TARGETS, make_adapter, peft_embed

pytest.importorskip("peft")
FP32_MIN_COSINE = 0.99999
BLOCK_BYTES = 2 * 2 * 16 * 2 * 32 * 4  # tiny Qwen3: layers x (k, v) x 16 x kv heads x head_dim x 4 B


@pytest.fixture(scope="module")
def decoder_adapters(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {
        "r4-qv": make_adapter(qwen3_dir, root / "r4", 4, ["q_proj", "v_proj"], seed=1),
        "r16-all": make_adapter(qwen3_dir, root / "r16", 16, DECODER_TARGETS, seed=2),
        "r64-mlp": make_adapter(
            qwen3_dir, root / "r64", 64, ["gate_proj", "down_proj"], seed=3, use_rslora=True
        ),
        "patterns": make_adapter(
            qwen3_dir,
            root / "pat",
            8,
            ["k_proj", "up_proj", "o_proj"],
            seed=4,
            rank_pattern={"up_proj": 4},
            alpha_pattern={"layers.1.self_attn.o_proj": 3.0},
        ),
    }


def _modules(adapters: dict[str, Path]) -> tuple[str, ...]:
    return tuple(f"{name}={path}" for name, path in adapters.items())


def _mixed(engine: Engine, names: list[str | None], seqs: list[list[int]]) -> dict[str | None, np.ndarray]:
    """Every name's inputs queued before any runs: steps mix the adapters' rows."""
    engines = {n: engine if n is None else view(engine, engine.adapters.get(n)) for n in names}  # type: ignore[union-attr]
    futures = {n: submit(e, seqs, prompt="")[0] for n, e in engines.items()}
    return {n: np.stack([f.result().vector.numpy() for f in fs]) for n, fs in futures.items()}


def test_decoder_adapters_in_mixed_batches_match_peft(
    qwen3_dir: Path, decoder_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[set[str | None]] = []
    real = model_runner.step_rows

    def spy(parts: Any, device: Any) -> Any:
        steps.append({None if a is None else a.name for a, _, _ in parts})
        return real(parts, device)

    monkeypatch.setattr(model_runner, "step_rows", spy)
    seqs = [random_ids(n, seed=n) for n in (3, 37, 150, 700)]  # 700: the layer-major lane
    names: list[str | None] = [None, *decoder_adapters]
    with Engine.from_pretrained(
        qwen3_dir, lora_modules=_modules(decoder_adapters), max_num_batched_tokens=256, layer_major_tokens=500
    ) as engine:
        got = _mixed(engine, names, seqs)
        assert engine.stats()["layer_major_finished"] == len(names)
    assert max(len(s) for s in steps) >= 3  # rows of the base and several adapters in one step
    for name in names:
        want = peft_embed(qwen3_dir, None if name is None else decoder_adapters[name], seqs)
        assert cosine(got[name], want).min() >= FP32_MIN_COSINE, name
    base = peft_embed(qwen3_dir, None, seqs)
    assert cosine(got["r16-all"], base).max() < 0.99  # the adapter does change the vectors


def test_an_adapter_survives_preemption(qwen3_dir: Path, decoder_adapters: dict[str, Path]) -> None:
    parts = build_engine(
        qwen3_dir,
        lora_modules=_modules(decoder_adapters),
        max_num_batched_tokens=128,
        kv_cache_memory=90 * BLOCK_BYTES,  # the document and two 1,200-token queries do not fit
        layer_major_tokens=0,
    )
    assert parts.adapters is not None
    ids = random_ids(1300, seed=9)
    adapter = parts.adapters.get("r16-all")
    doc = Request(0, ids, EmbedParams(normalize=True), PoolingMethod.LAST, Priority.BATCH, adapter=adapter)
    got = preempted_vector(parts.core, doc)
    want = peft_embed(qwen3_dir, decoder_adapters["r16-all"], [ids])
    assert cosine(got[None], want)[0] >= FP32_MIN_COSINE


def test_encoder_adapters_match_peft(tmp_path: Path) -> None:
    base = build_encoder(tmp_path / "bert")
    adapters = {
        "a": make_adapter(base, tmp_path / "a", 8, ENCODER_TARGETS, seed=5),
        "b": make_adapter(base, tmp_path / "b", 32, ["query", "value"], seed=6),
    }
    seqs = [[101, *random_ids(n, seed=n, vocab=30000)[1:], 102] for n in (4, 30, 120)]
    with Engine.from_pretrained(base, lora_modules=_modules(adapters), max_num_batched_tokens=128) as engine:
        got = _mixed(engine, [None, "a", "b"], seqs)
    for name in (None, "a", "b"):
        want = peft_embed(base, None if name is None else adapters[name], seqs, pooling="mean")
        assert cosine(got[name], want).min() >= FP32_MIN_COSINE, name


def test_bf16_adapters_stay_close_to_fp32_peft(qwen3_dir: Path, decoder_adapters: dict[str, Path]) -> None:
    seqs = [random_ids(n, seed=3 * n) for n in (20, 300)]
    names: list[str | None] = ["r16-all", "r64-mlp"]
    with Engine.from_pretrained(
        qwen3_dir, dtype="bfloat16", lora_modules=_modules(decoder_adapters), max_num_batched_tokens=128
    ) as engine:
        got = _mixed(engine, names, seqs)
    for name in names:
        assert name is not None
        assert (
            np.quantile(cosine(got[name], peft_embed(qwen3_dir, decoder_adapters[name], seqs)), 0.01) >= 0.999
        )


def test_prefix_cache_is_keyed_by_adapter(qwen3_dir: Path, decoder_adapters: dict[str, Path]) -> None:
    """The same tokens under the base and an adapter: K/V the base cached is not the adapter's."""
    ids = random_ids(100, seed=21)
    with Engine.from_pretrained(
        qwen3_dir, lora_modules=_modules(decoder_adapters), enable_prefix_caching=True, layer_major_tokens=0
    ) as engine:
        engine.embed([ids])
        adapted = view(engine, engine.adapters.get("r16-all"))  # type: ignore[union-attr]
        got = adapted.embed([ids])
        again = adapted.embed([ids])  # its own blocks are found
        stats = engine.stats()
    want = peft_embed(qwen3_dir, decoder_adapters["r16-all"], [ids])
    assert cosine(got, want)[0] >= FP32_MIN_COSINE
    assert cosine(again, want)[0] >= FP32_MIN_COSINE
    assert stats["prefix_hit_tokens"] == 96  # the adapter's second run, 6 blocks; none across


def test_merged_adapter_matches_peft(qwen3_dir: Path, decoder_adapters: dict[str, Path]) -> None:
    seqs = [random_ids(n, seed=n + 1) for n in (9, 200)]
    path = decoder_adapters["patterns"]
    with Engine.from_pretrained(qwen3_dir, lora_modules=(f"p={path}",), merge_lora=True) as engine:
        got = engine.embed(seqs, prompt="")
        with pytest.raises(UnknownAdapterError):  # its weights are the adapter's: no view of it
            engine.with_adapter("p")
        assert engine.adapters is not None and engine.adapters.merged is not None
        with pytest.raises(ModelLoadError, match="merged into its weights"):
            engine.adapters.load("x", str(path))
    assert cosine(got, peft_embed(qwen3_dir, path, seqs)).min() >= FP32_MIN_COSINE


def test_adapters_load_and_unload_at_run_time(qwen3_dir: Path, decoder_adapters: dict[str, Path]) -> None:
    seqs = [random_ids(30, seed=2)]
    with Engine.from_pretrained(qwen3_dir, enable_lora=True, max_loras=1) as engine:
        adapters = engine.adapters
        assert adapters is not None and adapters.all() == []
        adapters.load("x", str(decoder_adapters["r4-qv"]))
        with pytest.raises(ModelLoadError, match="--max-loras"):
            adapters.load("y", str(decoder_adapters["r16-all"]))
        with pytest.raises(ModelLoadError, match="already loaded"):
            adapters.load("x", str(decoder_adapters["r16-all"]))
        futures, _ = submit(engine.with_adapter("x"), seqs, prompt="")
        adapters.unload("x")  # queued work finishes with the adapter it was queued for
        got = futures[0].result().vector.numpy()  # type: ignore[union-attr]
        with pytest.raises(UnknownAdapterError, match="no LoRA adapter named 'x' is loaded"):
            engine.with_adapter("x")
    assert cosine(got[None], peft_embed(qwen3_dir, decoder_adapters["r4-qv"], seqs))[0] >= FP32_MIN_COSINE


def test_bad_adapters_are_refused_by_name(
    qwen3_dir: Path, qwen2_dir: Path, decoder_adapters: dict[str, Path], tmp_path: Path
) -> None:
    other = make_adapter(qwen2_dir, tmp_path / "other", 4, ["q_proj"], seed=1)  # another base's shapes
    dora = make_adapter(qwen3_dir, tmp_path / "dora", 4, ["q_proj"], seed=1, use_dora=True)
    saved = make_adapter(qwen3_dir, tmp_path / "saved", 4, ["q_proj"], seed=1, modules_to_save=["norm"])
    pissa = make_adapter(qwen3_dir, tmp_path / "pissa", 4, ["q_proj"], seed=1)
    config = json.loads((pissa / "adapter_config.json").read_text())
    (pissa / "adapter_config.json").write_text(json.dumps({**config, "init_lora_weights": "pissa_niter_4"}))
    with Engine.from_pretrained(qwen3_dir, enable_lora=True, max_lora_rank=16) as engine:
        adapters = engine.adapters
        assert adapters is not None
        cases = [
            (str(decoder_adapters["r64-mlp"]), "rank 64, above --max-lora-rank 16"),
            (str(dora), "DoRA"),
            (str(saved), "modules_to_save"),
            (str(tmp_path / "missing"), "adapter_config.json is missing"),
            (str(pissa), "changes the base weights it was trained on"),
        ]
        for path, message in cases:
            with pytest.raises(ModelLoadError, match=message):
                adapters.load("a", path)
        with pytest.raises(ModelLoadError, match="another base model"):
            adapters.load("a", str(other))
        with pytest.raises(ModelLoadError, match="adapter name"):
            adapters.load("bad name", str(decoder_adapters["r4-qv"]))
        assert adapters.all() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lora_modules": ("a",)}, "NAME=DIR"),
        ({"lora_modules": ("a=/x", "a=/y")}, "twice"),
        ({"merge_lora": True}, "exactly one"),
        ({"enable_lora": True, "deterministic": True}, "deterministic mode"),
        ({"enable_lora": True, "compile_backend": "eager"}, "compile_backend"),
        ({"lora_modules": ("a=/x", "b=/y"), "max_loras": 1}, "above --max-loras 1"),
        ({"enable_lora": True, "tensor_parallel_size": 2}, "not supported with tensor_parallel_size > 1"),
    ],
)
def test_option_combinations_are_refused(qwen3_dir: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        build_engine(qwen3_dir, **options)


def test_an_architecture_without_adapters_is_refused(tmp_path: Path, qwen3_vl_dir: Path) -> None:
    from tests.helpers.tiny_gemma import build_gemma3

    with pytest.raises(ModelLoadError, match="not on Gemma3"):
        build_engine(build_gemma3(tmp_path / "g"), enable_lora=True)
    with pytest.raises(ModelLoadError, match="not supported with multimodal models"):
        build_engine(qwen3_vl_dir, enable_lora=True)


def test_rows_of_a_step_are_grouped_per_adapter() -> None:
    from embedserve.lora.adapter import LoraAdapter

    a, b = (LoraAdapter(n, "", 4, n, {}) for n in ("a", "b"))
    rows = lora_rows.step_rows([(a, 3, 1), (None, 2, 2), (a, 4, 1), (b, 1, 1)], torch.device("cpu"))
    assert rows is not None
    groups = {ad.name: where for ad, where in rows.groups(10)}
    assert groups["b"] == slice(9, 10) and groups["a"].tolist() == [0, 1, 2, 5, 6, 7, 8]
    pooled = {ad.name: where for ad, where in rows.groups(5)}
    assert pooled["a"].tolist() == [0, 3] and pooled["b"] == slice(4, 5)
    assert {ad.name for ad, _ in rows.groups(16)} == {"a", "b"}  # a padded step: same rows
    with pytest.raises(RuntimeError, match="7 rows"):
        rows.groups(7)
    assert lora_rows.step_rows([(None, 3, 1)], torch.device("cpu")) is None


def test_an_engine_rebuilt_keeps_the_adapters_it_served(
    qwen3_dir: Path, decoder_adapters: dict[str, Path]
) -> None:
    """After its loop died, the server's new engine serves the adapters the old one served (as
    replaced and unloaded at run time), the same weights without reading files again."""
    from embedserve.server.runtime import keep_adapters

    seqs = [random_ids(25, seed=5)]
    modules = _modules({k: decoder_adapters[k] for k in ("r4-qv", "r16-all")})
    with (
        Engine.from_pretrained(qwen3_dir, lora_modules=modules) as old,
        Engine.from_pretrained(qwen3_dir, lora_modules=modules) as new,
    ):
        assert old.adapters is not None and new.adapters is not None
        old.adapters.replace("r4-qv", str(decoder_adapters["patterns"]))
        old.adapters.unload("r16-all")
        keep_adapters(old, new)
        assert [a.name for a in new.adapters.all()] == ["r4-qv"]
        got = new.with_adapter("r4-qv").embed(seqs, prompt="")
    assert cosine(got, peft_embed(qwen3_dir, decoder_adapters["patterns"], seqs))[0] >= FP32_MIN_COSINE


def test_peft_patterns_prefer_the_modules_own_name() -> None:
    from embedserve.lora.peft_files import _pattern

    patterns = {"q_proj": 16, "model.layers.0.self_attn.q_proj": 32}
    assert _pattern(patterns, "model.layers.0.self_attn.q_proj", 8) == 32
    assert _pattern(patterns, "model.layers.1.self_attn.q_proj", 8) == 16
    assert _pattern(patterns, "model.layers.1.self_attn.k_proj", 8) == 8
