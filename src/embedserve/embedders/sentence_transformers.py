"""`sentence-transformers:PATH` (`st:PATH`): the reference through sentence-transformers.

Tokenization, prompts, truncation, pooling and normalization come from the model directory
exactly as sentence-transformers applies them; float32 unless `?dtype=` says otherwise.
Token-id items skip the tokenizer and go straight through the module pipeline, one at a
time (no padding), so they test pure numerics.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedserve.embedders.base import Item, VectorSource, split_items
from embedserve.embedders.errors import SourceError
from embedserve.embedders.spec import Spec
from embedserve.errors import ModelLoadError
from embedserve.models.router import router_dirs

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def reference_dtype(spec: Spec) -> tuple[str, torch.dtype]:
    """A reference's `?dtype=` (float32 unless it says otherwise)."""
    name = spec.option("dtype", "float32") or "float32"
    if name not in _DTYPES:
        raise SourceError(f"{spec.shown}: dtype {name!r} is not one of {', '.join(_DTYPES)}")
    return name, _DTYPES[name]


def _sparse_kind(root: Path) -> tuple[bool, bool]:
    """(a SparseEncoder save: MLMTransformer / SpladePooling, or a Router over them; a Router:
    inference-free SPLADE, whose queries and documents take different routes)."""
    try:
        routed = router_dirs(root)
    except ModelLoadError as e:
        raise SourceError(f"{e}: not a reference (only an inference-free SPLADE Router is)") from None
    if routed is not None:
        return True, True
    modules = root / "modules.json"
    kinds = (
        {str(m.get("type", "")).rsplit(".", 1)[-1] for m in json.loads(modules.read_text())}
        if modules.exists()
        else set()
    )
    return bool(kinds & {"SpladePooling", "MLMTransformer"}), False


class SentenceTransformersSource(VectorSource):
    kind = "sentence-transformers"

    def __init__(self, spec: Spec) -> None:
        from sentence_transformers import SentenceTransformer

        self.spec = spec.shown
        self.model_dir = Path(spec.location)
        dtype, torch_dtype = reference_dtype(spec)
        self.dtype, self.device = dtype, spec.option("device", "cpu") or "cpu"
        self.take_batching(spec, 16, 16384)
        self.sparse, self.sided = _sparse_kind(self.model_dir)
        if self.sparse:  # a SPLADE directory: sentence-transformers' SparseEncoder
            from sentence_transformers import SparseEncoder

            encoder: Any = SparseEncoder
        else:
            encoder = SentenceTransformer
        self.model = encoder(
            str(self.model_dir),
            device=self.device,
            local_files_only=True,
            model_kwargs={"dtype": torch_dtype},
        )
        self.model.eval()
        self.max_length = int(self.model.max_seq_length) if self.model.max_seq_length else None

    def embed_as(self, items: Sequence[Item], prompt: str, role: str) -> np.ndarray:
        if not self.sided:
            return self.embed(items, prompt)
        return self._sparse(items, prompt, {"task": role})  # the Router's route for that side

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        if self.sparse:
            return self._sparse(items, prompt, {"task": "document"} if self.sided else {})
        texts, ids = split_items(items)
        if texts:
            out = self.model.encode(
                texts, prompt=prompt, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False
            )
            return np.asarray(out, dtype=np.float32)
        rows = []
        with torch.inference_mode():
            for seq in ids:
                input_ids = torch.tensor([seq], device=self.model.device)
                features = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
                rows.append(self.model.forward(features)["sentence_embedding"][0].float().cpu().numpy())
        return np.stack(rows).astype(np.float32)

    def _sparse(self, items: Sequence[Item], prompt: str, task: dict[str, str]) -> np.ndarray:
        """Vocabulary-wide weights, as the engine answers a SPLADE model."""
        texts, ids = split_items(items)
        if ids:
            raise SourceError(f"{self.spec}: a SparseEncoder reference takes text, not token ids")
        out = self.model.encode(texts, prompt=prompt, batch_size=len(texts), convert_to_tensor=True, **task)
        return np.asarray(out.to_dense().float().cpu().numpy(), dtype=np.float32)

    def cache_identity(self) -> str:
        versions = ",".join(version(p) for p in ("sentence-transformers", "transformers", "torch"))
        return f"st|{self.model_version}|{self.dtype}|{self.device}|{versions}"

    def describe(self) -> dict[str, Any]:
        assert self.model_dir is not None
        modules = [type(m).__name__ for m in self.model]
        pooling = getattr(self.model[1], "pooling_mode", None) if len(self.model) > 1 else None
        dim = self.model.get_embedding_dimension()
        normalize = "Normalize" in modules
        versions = {p: version(p) for p in ("sentence-transformers", "transformers", "torch")}
        return self.describe_local(
            self.dtype,
            f"sentence-transformers/{self.dtype}/{self.device}",
            {"dimensions": dim, "pooling": str(pooling), "normalize": normalize},
            {
                "modules": modules,
                "max_seq_length": self.max_length,
                "device": self.device,
                "batch_size": self.batch_items,
                "batch_tokens": self.batch_tokens,
                "versions": versions,
            },
        )

    def close(self) -> None:
        del self.model
