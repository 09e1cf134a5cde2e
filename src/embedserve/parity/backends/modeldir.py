"""What the parity tool reads from a local model directory itself (independently of the engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from embedserve.parity.options import ParityError


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ParityError(f"cannot read {path}: {e}") from None


def model_prompts(model_dir: Path) -> dict[str, str]:
    """The sentence-transformers prompts of a model (`config_sentence_transformers.json`)."""
    f = model_dir / "config_sentence_transformers.json"
    if not f.exists():
        return {}
    prompts = _json(f).get("prompts") or {}
    return {str(k): str(v) for k, v in prompts.items()}


class TokenCounter:
    """Counts the tokens a model sees (its post-processor's special tokens included)."""

    def __init__(self, model_dir: Path) -> None:
        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise ParityError(f"{model_dir} has no tokenizer.json to measure token lengths with")
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

    def count(self, text: str) -> int:
        return len(self._tok.encode(text).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(texts)]
