"""What the references and parity read from a local model directory themselves (not through the engine)."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image
from tokenizers import Tokenizer

from embedserve.embedders.errors import SourceError
from embedserve.errors import ModelLoadError
from embedserve.models.router import router_dirs
from embedserve.vision.image import ImageConfig, image_tokens

DEFAULT_INSTRUCTION = "Represent the user's input."  # Qwen3-VL-Embedding's default system message
IMAGE_PAD = "<|image_pad|>"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SourceError(f"cannot read {path}: {e}") from None


def model_prompts(model_dir: Path) -> dict[str, str]:
    """The sentence-transformers prompts of a model (`config_sentence_transformers.json`)."""
    f = model_dir / "config_sentence_transformers.json"
    if not f.exists():
        return {}
    prompts = _json(f).get("prompts") or {}
    return {str(k): str(v) for k, v in prompts.items()}


def is_vl_dir(path: Path) -> bool:
    """A Qwen3-VL directory (served by the multimodal path; referenced by transformers)."""
    cfg = path / "config.json"
    return cfg.exists() and _json(cfg).get("model_type") == "qwen3_vl"


def official_prompt(parts: Sequence[object], instruction: str) -> str:
    """The official embedder's chat format, one <|image_pad|> per non-text part (expanded later)."""
    body = "".join(p if isinstance(p, str) else f"<|vision_start|>{IMAGE_PAD}<|vision_end|>" for p in parts)
    return (
        f"<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n{body}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def tokenizer_dir(model_dir: Path) -> Path | None:
    """Where a model directory's tokenizer.json is: the directory, or an inference-free SPLADE
    Router's document model (its queries are tokenized with the same vocabulary)."""
    if (model_dir / "tokenizer.json").exists():
        return model_dir
    try:
        routed = router_dirs(model_dir)
    except ModelLoadError:
        return None
    return routed.document if routed is not None and (routed.document / "tokenizer.json").exists() else None


class TokenCounter:
    """Counts the tokens a model sees (its post-processor's special tokens included)."""

    def __init__(self, model_dir: Path) -> None:
        model_dir = tokenizer_dir(model_dir) or model_dir
        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise SourceError(f"{model_dir} has no tokenizer.json to measure token lengths with")
        self.source = str(path)
        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_truncation()
        self._tok.no_padding()
        vocab_limit = self._tok.get_vocab_size(with_added_tokens=False)
        cfg = model_dir / "config.json"
        if cfg.exists():
            vocab_limit = min(vocab_limit, int(_json(cfg).get("vocab_size", vocab_limit)))
        special = {i for i, tok in self._tok.get_added_tokens_decoder().items() if tok.special}
        self.ordinary_ids = [i for i in range(vocab_limit) if i not in special]
        pre = model_dir / "preprocessor_config.json"
        self.image: ImageConfig | None = ImageConfig.from_json(_json(pre)) if pre.exists() else None

    def image_tokens(self, width: int, height: int) -> int:
        if self.image is None:
            raise SourceError(
                f"{self.source}: the model has no preprocessor_config.json (it takes no images)"
            )
        return image_tokens(width, height, self.image)

    def count_parts(self, parts: Sequence[str | bytes], instruction: str) -> int:
        """Tokens of a text + image input in the chat format: each image's tokens from its size."""
        sizes = [Image.open(io.BytesIO(p)).size for p in parts if isinstance(p, bytes)]
        text = self.count(official_prompt(parts, instruction or DEFAULT_INSTRUCTION))
        return text + sum(self.image_tokens(w, h) - 1 for w, h in sizes)  # one pad each already

    def count(self, text: str) -> int:
        return len(self._tok.encode(text).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(texts)]
