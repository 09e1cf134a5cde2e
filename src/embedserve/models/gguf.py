"""Load a model straight from a GGUF file (llama.cpp's format), weights dequantized.

The file holds everything: `{arch}.*` numbers become the ModelConfig (through the same
`config.json` path as a Hugging Face directory), `tokenizer.ggml.*` the tokenizer, and each
tensor is dequantized (`gguf.quants`: f32, f16, bf16, q8_0, the k-quants...) and renamed to its
Hugging Face name by the architecture's layout (models/gguf_layout.py):

    decoders  llama, qwen2, qwen3                   (models/gguf_layout.py)
    encoders  bert, nomic-bert, gemma-embedding     (models/gguf_encoders.py)

`{arch}.pooling_type` (mean, cls, last), where the converter wrote it, is the pooling; the
caller's `pooling=` still wins. llama.cpp's converter reorders the rows of Q and K for `llama`
files (its RoPE pairs neighbouring dimensions, Hugging Face pairs the two halves of a head);
we undo that here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from embedserve.config import PoolingConfig, PoolingMethod
from embedserve.errors import ModelLoadError
from embedserve.models.gguf_encoders import ENCODERS, gemma_dense
from embedserve.models.gguf_layout import DECODERS, unpermute_rope_rows
from embedserve.models.gguf_tokenizer import gguf_tokenizer
from embedserve.models.registry import model_config_from_hf, sliding_window
from embedserve.models.source import ModelSource, default_pooling, override_pooling

if TYPE_CHECKING:
    import torch

LAYOUTS = {**DECODERS, **ENCODERS}
# `{arch}.pooling_type` (llama.cpp's enum) -> ours; 0 (none) leaves the model's default
_POOLING = {1: PoolingMethod.MEAN, 2: PoolingMethod.CLS, 3: PoolingMethod.LAST}
_RANK = 4


@dataclass(frozen=True, kw_only=True)
class GGUFModel(ModelSource):
    reader: Any  # gguf.GGUFReader (memory-mapped; tensors are read on demand)
    arch: str

    def _meta(self, key: str, default: Any = None) -> Any:
        return _field(self.reader, key, default)

    def tokenizer(self) -> HFTokenizer:
        return gguf_tokenizer(self._meta)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        import torch  # only here: opening a model (its config, tokenizer) stays torch-free
        from gguf import quants

        cfg, layout = self.model, LAYOUTS[self.arch]
        for t in self.reader.tensors:
            if t.name == "rope_freqs.weight":
                raise ModelLoadError("per-dimension RoPE frequency factors (rope_freqs) are not supported")
            if t.name in layout.skipped:
                continue
            try:
                values = np.array(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            except Exception as e:  # unknown quantization types raise NotImplementedError and others
                raise ModelLoadError(f"cannot dequantize {t.name} ({t.tensor_type.name}): {e}") from e
            values = layout.restore(t.name, values)
            if self.arch == "llama" and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
                heads = cfg.num_attention_heads if ".attn_q." in t.name else cfg.num_key_value_heads
                values = unpermute_rope_rows(values, heads)
            yield layout.hf_name(t.name), torch.from_numpy(values)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_gguf(path: str | Path, pooling: str | None = None, normalize: bool | None = None) -> GGUFModel:
    from gguf import GGUFReader

    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"GGUF file {file} does not exist")
    try:
        reader = GGUFReader(file, "r")
    except Exception as e:  # bad magic, truncated header or tensor data: gguf raises assorted types
        raise ModelLoadError(f"cannot read GGUF file {file}: {type(e).__name__}: {e}") from e
    arch = _field(reader, "general.architecture")
    layout = LAYOUTS.get(arch) if isinstance(arch, str) else None
    if layout is None:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(sorted(LAYOUTS))}"
        )

    def get(key: str, default: Any = ...) -> Any:
        value = _field(reader, f"{arch}.{key}", None if default is ... else default)
        if value is None:
            raise ModelLoadError(f"the GGUF file has no {arch}.{key}")
        return value

    tensors = {t.name: t for t in reader.tensors}
    raw = layout.config(get, tensors)
    model = model_config_from_hf(raw)
    base = _pooling(default_pooling(model), int(get("pooling_type", 0)), arch)
    if arch == "gemma-embedding":
        base = replace(base, dense=gemma_dense(file, get, tensors, model.hidden_size))
    return GGUFModel(
        path=file,
        model=model,
        pooling=override_pooling(base, pooling, normalize),
        sliding_window=sliding_window(raw),
        reader=reader,
        arch=arch,
    )


def _pooling(base: PoolingConfig, code: int, arch: str) -> PoolingConfig:
    """The pooling the converter recorded (from the model's sentence-transformers files)."""
    if code == _RANK:
        raise ModelLoadError(
            f"this {arch} GGUF is a reranker (pooling_type rank): only embedding GGUFs are served"
        )
    if code in _POOLING:
        return replace(base, method=_POOLING[code])
    if code:
        raise ModelLoadError(f"unknown GGUF pooling_type {code}")
    return base
