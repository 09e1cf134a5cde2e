"""What a multi-vector model's files say about its tokens, read without torch (the gateway counts
with it; models/multivector.py adds the projection's weights): which layout, each side's prompt,
length and query expansion, and which positions give vectors.

Two layouts are read:

* ColBERT as sentence-transformers' MultiVectorEncoder saves it (modules.json: Transformer, a
  `Dense` over `token_embeddings`, `MultiVectorMask`, optionally `Normalize`), and PyLate v3's
  save (config_sentence_transformers.json `model_type: "ColBERT"`: Transformer + Dense, the
  punctuation skiplist, masking and normalization implied). Its sides differ:
  - a query is cut to `query_expansion.length` tokens (strategy "fixed") and padded to it with
    the expansion token ([MASK]); every position is a vector; with `attend: false` the padding
    positions are queries only, never keys (the encoder's attention reads `attend_keys`);
  - a document is cut to `document_length` tokens; tokens of the skiplist give no vector.
* BGE-M3's `colbert_linear.pt` (Linear(hidden, hidden)): every token but the first (CLS) gives
  a vector, normalized.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from embedserve.errors import ModelLoadError
from embedserve.models.st_dense import TOKENS, input_name, module_config, read_json
from embedserve.models.tensor_header import tensor_shape

BGE_M3_FILE = "colbert_linear.pt"
MULTIVECTOR_MODULES = ("Dense", "MultiVectorMask")


@dataclass(frozen=True)
class QueryExpansion:
    """ColBERT's query expansion: queries padded to `length` with `token_id`."""

    fixed: bool  # "fixed": queries are cut to `length` too; "min": `length` is only a floor
    attend: bool  # whether the encoder attends to the expansion positions
    token_id: int
    length: int


@dataclass(frozen=True, kw_only=True)
class TokenVectors:
    """Which positions of an input give vectors, per side, and how many the model reads."""

    normalize: bool
    drop_first: bool  # BGE-M3: the CLS row gives no vector
    skiplist: frozenset[int]  # token ids that give no vector on the skiplist's sides
    skiplist_sides: frozenset[str]  # "query" / "document"
    keep_only: frozenset[int] | None  # documents: only these token ids give vectors
    expansion: QueryExpansion | None
    query_length: int | None  # the query side's token limit (None: the model's)
    document_length: int | None
    only: bool  # ColBERT: multi-vectors only; BGE-M3 also answers single (CLS) vectors

    def side_prompt(
        self, side: str, prompt_name: str | None, prompt: str | None, prompts: dict[str, str]
    ) -> str | None:
        """The prompt name an input of `side` uses when the request names none: the side's own
        (sentence-transformers' encode_query / encode_document)."""
        if prompt_name is None and prompt is None:
            names = ("query",) if side == "query" else ("document", "passage", "corpus")
            return next((n for n in names if n in prompts), None)
        return prompt_name

    def side_limit(self, side: str, max_model_len: int) -> int:
        """The most tokens an input of `side` may have (a fixed expansion's length for queries)."""
        limit = self.query_length if side == "query" else self.document_length
        if side == "query" and self.expansion is not None and self.expansion.fixed:
            limit = self.expansion.length
        return max_model_len if limit is None else min(max_model_len, limit)

    def read_length(self, side: str, n: int) -> int:
        """Positions the model reads for an input of `n` tokens on `side` (a query's expansion)."""
        if side == "query" and self.expansion is not None:
            return max(n, self.expansion.length)
        return n

    def keeps(self, token_ids: list[int], side: str) -> list[bool]:
        """Which positions of a `side` input give a vector."""
        keep = [True] * len(token_ids)
        if self.drop_first and keep:
            keep[0] = False
        if side in self.skiplist_sides and self.skiplist:
            keep = [k and t not in self.skiplist for k, t in zip(keep, token_ids, strict=True)]
        if side == "document" and self.keep_only is not None:
            keep = [k and t in self.keep_only for k, t in zip(keep, token_ids, strict=True)]
        return keep


def multivector_root(root: Path) -> Path | None:
    """`root` when its files describe a multi-vector model (either layout), else None."""
    if is_bge_m3(root):
        return root
    if _st_config(root).get("model_type") in ("ColBERT", "MultiVectorEncoder"):
        return root
    return None


def legacy_prefixes(root: Path) -> dict[str, str]:
    """PyLate v3's query / document prefixes ("[unused0]", "[Q] "): inserted as tokens when it was
    trained; they become the side's prompt, the tokenizer taking each as one special token
    (`register_prefixes`), which makes prepending the text the same as inserting the token."""
    st = _st_config(root)
    if st.get("model_type") != "ColBERT":
        return {}
    out = {}
    for key, side in (("query_prefix", "query"), ("document_prefix", "document")):
        if st.get(key):
            out[side] = str(st[key])
    return out


def register_prefixes(tokenizer: HFTokenizer, prefixes: tuple[str, ...]) -> None:
    """Each prefix the vocabulary has (whole, else its first word) that tokenizes into pieces
    becomes one special token, as sentence-transformers' MultiVectorEncoder registers it."""
    from tokenizers import AddedToken

    vocab = tokenizer.get_vocab(with_added_tokens=True)
    added = []
    for value in prefixes:
        for prefix in (value, *value.split(None, 1)[:1]):
            if prefix not in vocab:
                continue
            if tokenizer.encode(prefix, add_special_tokens=False).tokens != [prefix]:
                added.append(AddedToken(prefix, normalized=False, special=True))
            break
    if added:
        tokenizer.add_special_tokens(added)


def is_bge_m3(root: Path) -> bool:
    return (root / BGE_M3_FILE).is_file() and (root / BGE_M3_FILE).stat().st_size > 0


# BGE-M3's colbert_linear: every token but CLS, normalized, beside its single (CLS) vectors
BGE_M3 = TokenVectors(
    normalize=True, drop_first=True, skiplist=frozenset(), skiplist_sides=frozenset(), keep_only=None,
    expansion=None, query_length=None, document_length=None, only=False,
)  # fmt: skip


def dense_folder(root: Path, kinds: dict[str, dict[str, Any]] | None = None) -> Path:
    """The folder of a sentence-transformers layout's Dense module (`kinds`: modules.json's
    entries by type, read here when not given)."""
    kinds = _modules(root) if kinds is None else kinds
    if "Dense" not in kinds:
        raise ModelLoadError(f"{root}: a multi-vector model needs a Dense module (modules.json)")
    return root / str(kinds["Dense"].get("path", "1_Dense"))


def check_dense(folder: Path, hidden: int) -> dict[str, Any]:
    """A ColBERT Dense module's config, checked against the model: Identity, in_features."""
    cfg = read_json(folder / "config.json")
    activation = str(cfg.get("activation_function", "torch.nn.modules.linear.Identity"))
    if not activation.endswith("Identity"):
        raise ModelLoadError(f"{folder}: Dense activation {activation} is not supported (Identity only)")
    if cfg.get("in_features") != hidden:
        raise ModelLoadError(f"{folder}: Dense in_features {cfg.get('in_features')} != hidden size {hidden}")
    return cfg


def check_dense_weight(folder: Path, cfg: dict[str, Any], hidden: int, shape: tuple[int, ...] | None) -> None:
    if shape != (cfg.get("out_features"), hidden):
        raise ModelLoadError(f"{folder}: expected linear.weight [{cfg.get('out_features')}, {hidden}]")


def check_dense_files(root: Path, hidden: int) -> None:
    """What the gateway checks of a multi-vector model's projection without torch: a ColBERT
    Dense module's config and its model.safetensors' shape (a pytorch_model.bin and BGE-M3's
    colbert_linear.pt are checked where they are loaded, by the pools)."""
    if is_bge_m3(root):
        return
    folder = dense_folder(root)
    cfg = check_dense(folder, hidden)
    if (folder / "model.safetensors").is_file():
        check_dense_weight(folder, cfg, hidden, tensor_shape(folder / "model.safetensors", "linear.weight"))


def read_token_vectors(root: Path, tokenizer: HFTokenizer) -> TokenVectors:
    if is_bge_m3(root):
        return BGE_M3
    kinds = _modules(root)
    dense_folder(root, kinds)  # a layout without a Dense module is refused here already
    st = _st_config(root)
    pylate = st.get("model_type") == "ColBERT"
    if pylate:
        mask: dict[str, Any] = {"skiplist_words": st.get("skiplist_words", list(string.punctuation))}
    elif "MultiVectorMask" in kinds:
        mask = read_json(
            root / str(kinds["MultiVectorMask"].get("path", "2_MultiVectorMask")) / "config.json"
        )
    else:
        mask = {}
    transformer = (
        read_json(root / "sentence_bert_config.json") if (root / "sentence_bert_config.json").exists() else {}
    )
    sides = mask.get("skiplist_tasks") or ["document"]
    keep_only = mask.get("keep_only_token_ids")
    return TokenVectors(
        # a Normalize of the pooled vector (its module_input_name) leaves token vectors as they are
        normalize=pylate or ("Normalize" in kinds and _reads_tokens(root, kinds["Normalize"])),
        drop_first=False,
        skiplist=frozenset(_ids(tokenizer, mask.get("skiplist_words") or [])),
        skiplist_sides=frozenset([sides] if isinstance(sides, str) else sides),
        keep_only=None if keep_only is None else frozenset(int(i) for i in keep_only),
        expansion=_expansion(root, st, transformer, tokenizer, pylate),
        query_length=_positive(
            transformer.get("query_length", st.get("query_length") if not pylate else None)
        ),
        document_length=_positive(transformer.get("document_length", st.get("document_length"))),
        only=True,
    )


def _modules(root: Path) -> dict[str, dict[str, Any]]:
    modules = read_json(root / "modules.json") if (root / "modules.json").exists() else []
    return {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}


def _reads_tokens(root: Path, module: dict[str, Any]) -> bool:
    return input_name(module_config(root, module)) == TOKENS


def _expansion(
    root: Path, st: dict[str, Any], transformer: dict[str, Any], tokenizer: HFTokenizer, pylate: bool
) -> QueryExpansion | None:
    cfg: dict[str, Any] | None
    if pylate:  # PyLate v3's flat fields: expansion on unless do_query_expansion is false
        if st.get("do_query_expansion") is False:
            return None
        cfg = {"strategy": "fixed", "attend": bool(st.get("attend_to_expansion_tokens")),
               "length": st.get("query_length") or 32}  # fmt: skip
    else:
        cfg = transformer.get("query_expansion")
        if cfg is None:
            return None
    if cfg.get("strategy") not in ("fixed", "min") or _positive(cfg.get("length")) is None:
        raise ModelLoadError(f"{root}: query_expansion {cfg} needs strategy fixed / min and a length")
    token = cfg.get("token") or _special(root, "mask_token") or _special(root, "eos_token")
    token_id = tokenizer.token_to_id(token) if isinstance(token, str) else None
    if token_id is None:
        raise ModelLoadError(f"{root}: the query expansion token {token!r} is not in the vocabulary")
    return QueryExpansion(
        cfg["strategy"] == "fixed", bool(cfg.get("attend", False)), token_id, int(cfg["length"])
    )


def _special(root: Path, key: str) -> str | None:
    for file in ("tokenizer_config.json", "special_tokens_map.json"):
        if (root / file).exists():
            value = read_json(root / file).get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                return value
    return None


def _ids(tokenizer: HFTokenizer, words: list[str]) -> list[int]:
    """Skiplist words as sentence-transformers resolves them: a word that is one vocabulary
    entry gives its id; others are dropped."""
    return [i for i in (tokenizer.token_to_id(str(w)) for w in words) if i is not None]


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _st_config(root: Path) -> dict[str, Any]:
    f = root / "config_sentence_transformers.json"
    return read_json(f) if f.exists() else {}
