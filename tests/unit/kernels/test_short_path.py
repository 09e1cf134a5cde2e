"""Short steps in one native call (models/short_path.py, kernels/short_forward.cpp): the same
vectors as transformers and as the layer-by-layer path, the same K/V in the cache, and the
layer-by-layer path for every step that does not fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import Engine
from embedserve.attention.metadata import AttentionMetadata, SeqSpan
from embedserve.engine.builder import EngineParts, build_engine
from embedserve.kernels.short_forward import ROWS_LIMIT, ShortForward
from embedserve.models.decoder import DecoderModel
from embedserve.models.short_path import ShortPath
from tests.helpers.cpu import short_rows_dtypes
from tests.helpers.reference import cosine, hf_embed_ids, random_ids
from tests.helpers.short_steps import record_short_steps

DTYPES = short_rows_dtypes()


def _engine(path: Path, dtype: torch.dtype, **kw: object) -> EngineParts:
    name = str(dtype).removeprefix("torch.")
    return build_engine(path, dtype=name, max_num_batched_tokens=256, kv_cache_memory=1 << 22, **kw)


def _model(parts: EngineParts) -> DecoderModel:
    model = parts.core.runner.model
    assert isinstance(model, DecoderModel)
    return model


def _step(lens: list[int], start: int = 0) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Ids, positions and metadata of one step of sequences of `lens` rows (slots 0..)."""
    rows = sum(lens)
    ids = torch.tensor([i for n in lens for i in random_ids(n, seed=n)])
    positions = torch.cat([torch.arange(start, start + n) for n in lens])
    spans, q = [], 0
    for n in lens:
        slots = None if start == 0 else torch.arange(q, q + start + n)
        spans.append(SeqSpan(q_start=q, q_len=n, start=start, kv_slots=slots))
        q += n
    return ids, positions, AttentionMetadata(spans, torch.arange(rows, dtype=torch.int64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("arch", "lens"),
    [
        ("qwen3", (1, 6, 13)),  # q/k norm
        ("qwen2", (1, 6, 13)),  # q/k/v bias
        ("llama", (1, 6, 13)),  # neither
        ("qwen3", (40, 33, 47)),  # 120 rows: natively in bfloat16 only (ROWS_LIMIT)
    ],
)
def test_short_steps_run_natively_and_match_transformers(
    request: pytest.FixtureRequest,
    arch: str,
    lens: tuple[int, ...],
    dtype: torch.dtype,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = request.getfixturevalue(f"{arch}_dir")
    taken = record_short_steps(monkeypatch)
    seqs = [random_ids(n, seed=100 + n) for n in lens]
    with Engine(_engine(path, dtype)) as engine:
        got = np.stack(engine.embed(seqs))  # one step of three whole sequences
    assert taken == [sum(lens) <= ROWS_LIMIT[dtype]]
    pooling = {"qwen3": "lasttoken", "qwen2": "mean", "llama": "cls"}[arch]  # the fixtures' (conftest.py)
    want = hf_embed_ids(path, seqs, pooling)  # ids as given: no EOS appended on either side
    cos = cosine(got, want)
    assert cos.min() > (0.999 if dtype == torch.bfloat16 else 0.99999), cos


@pytest.mark.parametrize("dtype", DTYPES)
def test_native_steps_equal_the_layer_by_layer_path_and_store_the_same_kv(
    qwen3_dir: Path, dtype: torch.dtype
) -> None:
    parts = _engine(qwen3_dir, dtype)
    model, caches = _model(parts), parts.core.runner.kv_caches
    assert model.short_path is not None and caches is not None
    ids, positions, meta = _step([1, 7, 12])
    rows = torch.tensor([0, 7, 19])
    got, kv = {}, {}
    with torch.inference_mode():
        for mode in ("native", "python"):
            for c in caches:
                c.fill_(7)  # what either path leaves unwritten stays 7
            native = model.short_path
            model.short_path = native if mode == "native" else None
            got[mode] = model(ids, positions, caches, meta, rows).float()
            model.short_path = native
            kv[mode] = [c.clone() for c in caches]
    # everything but the attention is the same kernels in the same order: layer 0's K/V (before
    # any attention) are bit for bit the same, later layers' and the outputs close
    assert torch.equal(kv["native"][0], kv["python"][0])
    assert torch.all(kv["native"][0][:, 20:] == 7)  # slots past the step's rows untouched
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0.05, "atol": 0.1}
    for a, b in zip(kv["native"], kv["python"], strict=True):
        torch.testing.assert_close(a.float(), b.float(), **tol)
    cos = torch.nn.functional.cosine_similarity(got["native"], got["python"])
    assert cos.min() > (0.999 if dtype == torch.bfloat16 else 0.9999999), cos  # bf16: attention rounds


@pytest.mark.parametrize("dtype", DTYPES)
def test_steps_that_do_not_fit_run_layer_by_layer(qwen3_dir: Path, dtype: torch.dtype) -> None:
    parts = _engine(qwen3_dir, dtype)
    model, caches = _model(parts), parts.core.runner.kv_caches
    path = model.short_path
    assert isinstance(path, ShortPath) and caches is not None
    limit = path.native.rows_limit
    with torch.inference_mode():
        x = model.embed(_step([3])[0])
        cos_sin = model.rotary.cos_sin(_step([3])[1], x.dtype)
        assert path.run(x.clone(), cos_sin, caches, _step([3])[2])
        cases = {
            "after a cached prefix": _step([3], start=4),
            "more rows than the kernels take": _step([limit + 1]),
        }
        for why, (ids, positions, meta) in cases.items():
            x = model.embed(ids)
            before = x.clone()
            assert not path.run(x, model.rotary.cos_sin(positions, x.dtype), caches, meta), why
            assert torch.equal(x, before), why
        ids, positions, meta = _step([3])
        padded = AttentionMetadata(meta.seqs, torch.tensor([0, 1, 2, -1]))  # a bucket's padding row
        x = model.embed(torch.cat([ids, ids[:1]]))
        padded_tables = model.rotary.cos_sin(torch.cat([positions, positions[:1]]), x.dtype)
        assert not path.run(x, padded_tables, caches, padded)
        # a weight replaced after the plan was built: the plan's addresses are stale, never read
        o_proj = model.layers[1].self_attn.o_proj
        o_proj.weight = torch.nn.Parameter(o_proj.weight.detach().clone(), requires_grad=False)
        x = model.embed(ids)
        assert not path.run(x, model.rotary.cos_sin(positions, x.dtype), caches, meta)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bad_calls_are_refused_with_a_message(qwen3_dir: Path, dtype: torch.dtype) -> None:
    model = _model(_engine(qwen3_dir, dtype))
    assert isinstance(model.short_path, ShortPath)
    native: ShortForward = model.short_path.native
    hidden, d = native.shapes.hidden, native.shapes.head_dim
    x, tables = torch.zeros(4, hidden, dtype=dtype), torch.zeros(4, d, dtype=dtype)
    with pytest.raises(ValueError, match="rows"):
        native.run(torch.zeros(native.rows_limit + 1, hidden, dtype=dtype), tables, tables, [(0, 4)])
    with pytest.raises(ValueError, match="CPU rows"):
        native.run(x.double(), tables, tables, [(0, 4)])
    with pytest.raises(ValueError, match="refused sequences"):
        native.run(x, tables, tables, [(0, 3)])  # rows 3 belongs to no sequence
    with pytest.raises(ValueError, match="together"):
        native.run(x, tables, tables, [(0, 4)], slot_mapping=torch.arange(4))
    caches = [torch.zeros(2, 8, native.shapes.kv_heads, d, dtype=dtype)] * native.num_layers
    with pytest.raises(ValueError, match="past the cache"):
        native.run(x, tables, tables, [(0, 4)], torch.tensor([0, 1, 2, 8]), caches)
    with pytest.raises(ValueError, match="dense"):
        native.run(x, tables, tables, [(0, 4)], torch.arange(4), [c.to(torch.float16) for c in caches])
