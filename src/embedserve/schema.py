"""Vector metadata: where a vector came from, so stored vectors can be traced and rebuilt.

- `model_version`: given by the operator, or a fingerprint of the model directory's files.
- `backend_profile`: device + dtype (`cpu-fp32`, `cuda-bf16`), `-tpN` on N tensor-parallel
  ranks, `-det` in deterministic mode:
  numerics, not meaning.
- `embedding_schema`: a stable id of the vector *space*. Two vectors with the same schema are
  comparable; anything that changes which vector an input maps to (weights, pooling,
  normalization, dimensions, the prompt table) changes the schema.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from embedserve.config import EngineConfig
from embedserve.errors import ModelLoadError
from embedserve.pooling.outputs import Output

if TYPE_CHECKING:  # dtypes and devices are named, not made: the gateway reads schemas without torch
    import torch

_CHUNK_BYTES = 1 << 20

# A quantization's arithmetic and calibration, in the vector space's key: change the entry when
# models/int8_linear.py or engine/quantize.py change what a vector is (bits, outlier share, probes).
_SCHEMES = {
    "int8": "int8:w8-per-channel,a7-per-token,float32-outliers=1/16,probes=18x512",
    "int8-weights": "int8-weights:q8_0-exact-else-w8-per-channel,float32-activations",
}
_DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # by dtype_name


def fingerprint_model_dir(path: str | Path) -> str:
    """Hash of a model file, or of every file's relative name and bytes in a model directory
    (hidden entries skipped).

    Every byte is read: a sampled hash would miss a fine-tune that touched a few tensors, and
    then two different vector spaces could share a schema. blake2b runs at disk speed and
    releases the GIL.
    """
    root = Path(path)
    base = root.parent if root.is_file() else root
    files = [root] if root.is_file() else sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )  # fmt: skip
    if not files:
        raise ModelLoadError(f"no model files to fingerprint at {root}")
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        h.update(f"{f.relative_to(base).as_posix()}\0{f.stat().st_size}\0".encode())
        with f.open("rb") as fh:
            while chunk := fh.read(_CHUNK_BYTES):
                h.update(chunk)
    return h.hexdigest()[:16]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def backend_profile(
    device: torch.device,
    dtype: torch.dtype,
    deterministic: bool = False,
    tensor_parallel_size: int = 1,
    quantization: str | None = None,
) -> str:
    """e.g. `cpu-fp32`, `cuda-bf16`; `-det` in deterministic mode (same vector space, so the
    embedding_schema does not change, but every vector is reproducible bit for bit); `-tp2`
    split across 2 ranks (same space; sums in another order, so not the same bits); `-int8`
    int8 projections (another space: the schema changes too)."""
    profile = f"{device.type}-{_DTYPE_SHORT.get(dtype_name(dtype), dtype_name(dtype))}"
    if quantization is not None:
        profile += f"-{quantization}"
    if tensor_parallel_size > 1:
        profile += f"-tp{tensor_parallel_size}"
    return f"{profile}-det" if deterministic else profile


@dataclass(frozen=True)
class ModelMetadata:
    model: str
    model_version: str
    dtype: str
    backend_profile: str
    hidden_size: int
    max_model_len: int
    default_normalize: bool
    # Everything else that decides the vector space, canonicalized once for `schema()`.
    space_key: str

    @classmethod
    def from_engine_config(
        cls, config: EngineConfig, model: str, model_version: str | None, fingerprint: str
    ) -> ModelMetadata:
        """`fingerprint`: `fingerprint_model_dir` of the model; it enters the schema even when
        the operator names the version, so different weights never share a schema."""
        version = model_version or fingerprint
        pool = config.pooling
        space = json.dumps(
            {
                "model_version": version,
                "weights": fingerprint,
                "pooling": pool.method.value,
                "pool_prompt": pool.include_prompt,
                **({"splade": list(pool.splade)} if pool.splade is not None else {}),
                **(
                    {"dense": [[d.out_features, d.bias, d.activation] for d in pool.dense]}
                    if pool.dense
                    else {}
                ),
                **({"quantization": _SCHEMES[config.quantization]} if config.quantization else {}),
                "prompts": config.prompts,
                "default_prompt": config.default_prompt_name,
            },
            sort_keys=True,
        )
        return cls(
            model=model,
            model_version=version,
            dtype=dtype_name(config.dtype),
            backend_profile=backend_profile(
                config.device,
                config.dtype,
                config.deterministic,
                config.tensor_parallel_size,
                config.quantization,
            ),
            # A SPLADE vector has a weight per vocabulary id (its indices are the tokenizer's ids,
            # whose file the fingerprint covers).
            hidden_size=config.vector_size,
            max_model_len=config.scheduler.max_model_len,
            default_normalize=pool.normalize,
            space_key=space,
        )

    def with_adapter(self, name: str, fingerprint: str) -> ModelMetadata:
        """A LoRA adapter's vectors on these base weights: its own name, version and vector space
        (its vectors never share an index with the base model's or another adapter's)."""
        return replace(
            self,
            model=name,
            model_version=f"{self.model_version}+lora.{fingerprint}",
            space_key=f"{self.space_key}|lora={fingerprint}",
        )

    def schema(
        self,
        dimensions: int | None = None,
        normalize: bool | None = None,
        embedding_type: str = "float",
        late: str | None = None,
    ) -> str:
        """Schema of vectors served with these request options (None = the model's default).
        `embedding_type`: "float", or a compressed type with its quantization key (e.g.
        "int8@fixed:1.0", "binary"): compressed and float vectors never share a schema.
        `late`: late chunking's span pooling ("mean", "last"): a chunk pooled inside its
        document is another vector than the chunk embedded alone."""
        dims = self.hidden_size if dimensions is None else dimensions
        norm = self.default_normalize if normalize is None else normalize
        key = f"{self.space_key}|dimensions={dims}|normalize={norm}"
        if late is not None:
            key += f"|late_chunking={late}"
        return compressed_schema("es1-" + hashlib.sha256(key.encode()).hexdigest()[:16], embedding_type)

    def fields(
        self,
        dimensions: int | None = None,
        normalize: bool | None = None,
        embedding_type: str = "float",
        late: str | None = None,
    ) -> dict[str, str]:
        """The metadata every embeddings response and the model listing carry."""
        return {
            "model": self.model,
            "model_version": self.model_version,
            "dtype": self.dtype,
            "backend_profile": self.backend_profile,
            "embedding_schema": self.schema(dimensions, normalize, embedding_type, late),
        }


def compressed_schema(float_schema: str, embedding_type: str) -> str:
    """The schema of `embedding_type` vectors made from vectors of `float_schema` (itself for
    "float"): whoever knows the float schema (an indexer quantizing a server's float vectors,
    the server quantizing its own) derives the same one."""
    if embedding_type == "float":
        return float_schema
    return "es1-" + hashlib.sha256(f"{float_schema}|type={embedding_type}".encode()).hexdigest()[:16]


MULTIVECTOR = Output.MULTIVECTOR.value  # multi-vectors' schema type prefix


def multivector_type(kind: str) -> str:
    """The schema's type of multi-vectors (`kind`: float or a compressed type's key): never
    shared with the model's single vectors."""
    return MULTIVECTOR if kind == "float" else f"{MULTIVECTOR}/{kind}"
