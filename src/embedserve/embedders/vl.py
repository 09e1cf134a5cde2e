"""`hf:PATH` / `sentence-transformers:PATH` on a Qwen3-VL directory: transformers' `Qwen3VLModel`,
the multimodal reference (sentence-transformers has no Qwen3-VL pipeline).

Independent of the engine: transformers' model, its Qwen2-VL image processor (PIL backend,
the directory's `preprocessor_config.json`), its tokenizer and `apply_chat_template` when the
directory has a chat template (the tokenizer's, `chat_template.jinja` or `.json`), else the
official embedder's format. The vector is the last
token's post-final-norm hidden state (`last_hidden_state`, not `hidden_states[-1]`),
L2-normalized. One input at a time (no padding); float32 unless `?dtype=`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from embedserve.embedders.base import Item, Parts, VectorSource
from embedserve.embedders.errors import SourceError
from embedserve.embedders.modeldir import DEFAULT_INSTRUCTION, IMAGE_PAD, official_prompt
from embedserve.embedders.sentence_transformers import reference_dtype
from embedserve.embedders.spec import Spec

VLPart = str | Image.Image


def file_template(path: Path) -> str | None:
    """A processor-style chat template (`chat_template.jinja` / `chat_template.json`), which
    the tokenizer alone does not load."""
    if (path / "chat_template.jinja").exists():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    if (path / "chat_template.json").exists():
        template = json.loads((path / "chat_template.json").read_text(encoding="utf-8")).get("chat_template")
        return template if isinstance(template, str) else None
    return None


class VLReference:
    """transformers on one Qwen3-VL directory."""

    def __init__(self, path: Path, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModel, AutoTokenizer
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.model = AutoModel.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa").eval()
        self.tok = AutoTokenizer.from_pretrained(str(path))
        pre = json.loads((path / "preprocessor_config.json").read_text(encoding="utf-8"))
        keys = ["size", "min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"]
        keys += ["image_mean", "image_std"]
        self.proc = Qwen2VLImageProcessorPil(**{k: pre[k] for k in keys if k in pre})
        self.template = self.tok.chat_template or file_template(path)
        self.image_token_id = int(self.tok.convert_tokens_to_ids(IMAGE_PAD))  # type: ignore[arg-type]

    def prompt(self, parts: Sequence[VLPart], instruction: str) -> str:
        if not self.template:
            return official_prompt(parts, instruction)
        content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in parts]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": [{"type": "text", "text": instruction}]},
            {"role": "user", "content": content},
        ]
        text = self.tok.apply_chat_template(
            messages, chat_template=self.template, tokenize=False, add_generation_prompt=True
        )
        return str(text)

    def embed(self, parts: Sequence[VLPart], instruction: str, text: str | None = None) -> np.ndarray:
        """One input's vector; `text`: the prompt already rendered (one pad per image)."""
        images = [p for p in parts if isinstance(p, Image.Image)]
        text = self.prompt(parts, instruction) if text is None else text
        kwargs: dict[str, torch.Tensor] = {}
        if images:
            kwargs = self.image_inputs(images)
            counts = iter((kwargs["image_grid_thw"].prod(-1) // self.proc.merge_size**2).tolist())
            while IMAGE_PAD in text:  # the processor's expansion: one pad per merged token
                text = text.replace(IMAGE_PAD, "<|placeholder|>" * next(counts), 1)
            text = text.replace("<|placeholder|>", IMAGE_PAD)
        ids = torch.tensor([self.tok(text)["input_ids"]])
        return self.embed_ids(ids, kwargs)

    def image_inputs(self, images: Sequence[Image.Image]) -> dict[str, torch.Tensor]:
        """The processor's pixel values and grids of `images`, as the model takes them."""
        feats = self.proc(images=list(images), return_tensors="pt")
        return {
            "pixel_values": feats["pixel_values"].to(self.model.dtype),
            "image_grid_thw": feats["image_grid_thw"],
        }

    def embed_ids(self, ids: torch.Tensor, kwargs: dict[str, torch.Tensor] | None = None) -> np.ndarray:
        hidden = self.hidden_rows(ids, kwargs)[-1]
        return torch.nn.functional.normalize(hidden, dim=-1).numpy()

    def hidden_rows(self, ids: torch.Tensor, kwargs: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Every position's post-final-norm row of one input's expanded ids [1, T]: [T, hidden] float32."""
        kwargs = dict(kwargs or {})
        if "pixel_values" in kwargs:
            kwargs["mm_token_type_ids"] = torch.eq(ids, self.image_token_id).int()
        with torch.inference_mode():
            return self.model(input_ids=ids, **kwargs).last_hidden_state[0].float()


def decoded(item: Parts) -> list[VLPart]:
    return [p if isinstance(p, str) else Image.open(io.BytesIO(p)).convert("RGB") for p in item.parts]


class VLReferenceSource(VectorSource):
    kind = "transformers-vl"

    def __init__(self, spec: Spec) -> None:
        self.spec = spec.shown
        self.model_dir = Path(spec.location)
        self.dtype, torch_dtype = reference_dtype(spec)
        self.take_batching(spec, 16, 16384)
        if (spec.option("device") or "cpu") != "cpu":
            raise SourceError(f"{spec.shown}: the Qwen3-VL reference runs on the CPU only")
        if not (self.model_dir / "preprocessor_config.json").exists():
            raise SourceError(
                f"{spec.shown}: {spec.location} has no preprocessor_config.json "
                "(a Qwen3-VL directory needs one)"
            )
        self.ref = VLReference(self.model_dir, torch_dtype)
        cfg = self.ref.model.config.get_text_config()
        self.max_length = int(cfg.max_position_embeddings)

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        instruction = prompt or DEFAULT_INSTRUCTION
        rows = []
        for item in items:
            if isinstance(item, tuple):  # token ids: the final sequence, as the engine takes them
                rows.append(self.ref.embed_ids(torch.tensor([list(item)])))
            else:
                parts = decoded(item) if isinstance(item, Parts) else [item]
                rows.append(self.ref.embed(parts, instruction))
        return np.stack(rows).astype(np.float32)

    def cache_identity(self) -> str:
        versions = ",".join(version(p) for p in ("transformers", "torch", "pillow"))
        return f"vl|{self.model_version}|{self.dtype}|{versions}"

    def describe(self) -> dict[str, Any]:
        dim = int(self.ref.model.config.get_text_config().hidden_size)
        return self.describe_local(
            self.dtype,
            f"transformers-vl/{self.dtype}/cpu",
            {"dimensions": dim, "pooling": "lasttoken", "normalize": True},
            {
                "class": type(self.ref.model).__name__,
                "chat_template": bool(self.ref.template),
                "batch_size": 1,
                "versions": {p: version(p) for p in ("transformers", "torch", "pillow")},
            },
        )

    def close(self) -> None:
        del self.ref
