"""`hf:PATH`: the reference through transformers alone, pooling written out here.

`AutoModel` + `AutoTokenizer` from the directory; the pooling (lasttoken, mean or cls) and the L2
normalization read from its sentence-transformers files (`modules.json`, the Pooling module's
`config.json`) by this module itself, not by the engine's loader, so a misread pooling in the
engine cannot hide in the reference; `?pooling=` / `?normalize=` override them (and are needed
when the directory has none). Prompts are prepended to texts; texts longer than the model's
limit (`sentence_bert_config.json`'s `max_seq_length`, else the config's positions) are cut at
the end. Texts go as padded batches (pooling reads the mask, either padding side); token-id items
one at a time, unpadded. float32 on the CPU unless `?dtype=` / `?device=` say otherwise.
A Qwen3-VL directory is referenced by embedders/vl.py instead.
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
from embedserve.embedders.sentence_transformers import reference_dtype
from embedserve.embedders.spec import Spec

POOLINGS = ("lasttoken", "mean", "cls")
_MODES = {"lasttoken": "lasttoken", "mean_tokens": "mean", "mean": "mean", "cls_token": "cls", "cls": "cls"}
_PIPELINE = ("Transformer", "Pooling", "Normalize")  # what this reference reproduces


def read_pooling(path: Path) -> tuple[str, bool] | None:
    """(pooling, normalize) as the directory's sentence-transformers pipeline applies them, or None
    without `modules.json`. Modules other than Transformer / Pooling / Normalize are refused."""
    modules_file = path / "modules.json"
    if not modules_file.exists():
        return None
    pooling, normalize = None, False
    for module in json.loads(modules_file.read_text(encoding="utf-8")):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _PIPELINE:
            raise SourceError(f"hf:{path}: module {kind} is not reproduced here (use sentence-transformers:)")
        if kind == "Normalize":
            normalize = True
        elif kind == "Pooling":
            cfg = json.loads(
                (path / module.get("path", "1_Pooling") / "config.json").read_text(encoding="utf-8")
            )
            if not cfg.get("include_prompt", True):
                raise SourceError(
                    f"hf:{path}: pooling without the prompt is not reproduced (use sentence-transformers:)"
                )
            modes = [cfg["pooling_mode"]] if "pooling_mode" in cfg else [
                k.removeprefix("pooling_mode_") for k, v in cfg.items() if k.startswith("pooling_mode_") and v
            ]  # fmt: skip
            if len(modes) != 1 or modes[0] not in _MODES:
                raise SourceError(f"hf:{path}: pooling {modes} is not one of {', '.join(POOLINGS)}")
            pooling = _MODES[modes[0]]
    if pooling is None:
        raise SourceError(f"hf:{path}: modules.json has no Pooling module")
    return pooling, normalize


def pool_padded(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Pool [batch, seq, hidden] under an attention mask, for left or right padding."""
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    if pooling == "lasttoken":
        # cumsum peaks first at the last attended position, whichever side was padded
        return hidden[rows, mask.cumsum(1).argmax(1)]
    if pooling == "cls":
        return hidden[rows, mask.argmax(1)]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def _lexical_head(spec: Spec, root: Path, tokenizer: Any) -> tuple[torch.Tensor, float, list[int]] | None:
    """`?output=lexical`: sparse_linear.pt's (weight, bias) and the ids FlagEmbedding leaves out
    (the tokenizer's cls, eos, pad and unk), read here, not by the engine's loader."""
    output = spec.option("output", "dense")
    if output == "dense":
        return None
    path = root / "sparse_linear.pt"
    if output != "lexical" or not path.exists():
        raise SourceError(
            f"{spec.shown}: output must be dense or lexical (a directory with sparse_linear.pt)"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    unused = [tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id]
    return state["weight"][0].float(), float(state["bias"].reshape(())), [i for i in unused if i is not None]


def lexical_weights(
    hidden: torch.Tensor,
    features: dict[str, torch.Tensor],
    w: torch.Tensor,
    b: float,
    unused: list[int],
    vocab: int,
) -> np.ndarray:
    """FlagEmbedding's lexical weights of padded rows: relu(w . h + b) per token, the largest per
    token id, special tokens and padding left out -> [batch, vocab] float32."""
    ids, mask = features["input_ids"], features["attention_mask"].bool()
    weights = torch.relu(hidden @ w.to(hidden.device) + b)
    weights = torch.where(mask & ~torch.isin(ids, torch.tensor(unused, device=ids.device)), weights, 0.0)
    out = torch.zeros(ids.shape[0], vocab, device=ids.device)
    return out.scatter_reduce_(1, ids, weights, reduce="amax", include_self=True).cpu().numpy()


def _limit(path: Path, config: Any) -> int | None:
    st = path / "sentence_bert_config.json"
    if st.exists():
        seq = json.loads(st.read_text(encoding="utf-8")).get("max_seq_length")
        if seq:
            return int(seq)
    positions = getattr(config, "max_position_embeddings", None)
    return int(positions) if positions else None


class TransformersSource(VectorSource):
    kind = "transformers"

    def __init__(self, spec: Spec) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.spec = spec.shown
        self.model_dir = Path(spec.location)
        self.dtype, torch_dtype = reference_dtype(spec)
        self.device = torch.device(spec.option("device") or "cpu")
        self.take_batching(spec, 16, 16384)
        read = read_pooling(self.model_dir)
        pooling = spec.option("pooling") or (read[0] if read else None)
        normalize = spec.option("normalize")
        if pooling not in POOLINGS or (read is None and normalize is None):
            raise SourceError(
                f"{self.spec}: pass ?pooling= (one of {', '.join(POOLINGS)}) and ?normalize=1/0: "
                "the directory has no modules.json to read them from"
            )
        self.pooling = pooling
        self.normalize = read[1] if normalize is None and read else normalize in ("1", "true", "yes", "on")
        self.tokenizer = AutoTokenizer.from_pretrained(spec.location, local_files_only=True)
        model = AutoModel.from_pretrained(spec.location, dtype=torch_dtype, local_files_only=True)
        self.model = model.to(self.device).eval()
        self.max_length = _limit(self.model_dir, self.model.config)
        self.lexical = _lexical_head(spec, self.model_dir, self.tokenizer)  # BGE-M3's weights
        self.sparse = self.lexical is not None

    def _pooled(self, features: dict[str, torch.Tensor]) -> np.ndarray:
        with torch.inference_mode():
            hidden = self.model(**features).last_hidden_state.float()  # [batch, seq, hidden]
        if self.lexical is not None:
            return lexical_weights(hidden, features, *self.lexical, self.model.config.vocab_size)
        vec = pool_padded(hidden, features["attention_mask"], self.pooling)
        if self.normalize:
            vec = torch.nn.functional.normalize(vec, dim=-1)
        return vec.cpu().numpy().astype(np.float32)

    def embed(self, items: Sequence[Item], prompt: str) -> np.ndarray:
        texts, ids = split_items(items)
        if texts:
            batch = self.tokenizer(
                [prompt + t for t in texts],
                padding=True,
                truncation=self.max_length is not None,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            return self._pooled(dict(batch))
        rows = []
        for seq in ids:
            input_ids = torch.tensor([seq], device=self.device)
            rows.append(
                self._pooled({"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)})[0]
            )
        return np.stack(rows)

    def cache_identity(self) -> str:
        versions = ",".join(version(p) for p in ("transformers", "torch"))
        how = f"{self.pooling}{'+norm' if self.normalize else ''}"
        return f"hf|{self.model_version}|{self.dtype}|{self.device}|{how}|{versions}"

    def describe(self) -> dict[str, Any]:
        dim = int(self.model.config.hidden_size)
        return self.describe_local(
            self.dtype,
            f"transformers/{self.dtype}/{self.device.type}",
            {"dimensions": dim, "pooling": self.pooling, "normalize": self.normalize},
            {
                "class": type(self.model).__name__,
                "max_length": self.max_length,
                "device": str(self.device),
                "batch_size": self.batch_items,
                "batch_tokens": self.batch_tokens,
                "versions": {p: version(p) for p in ("transformers", "torch")},
            },
        )

    def close(self) -> None:
        del self.model
