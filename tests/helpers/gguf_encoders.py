"""Encoder GGUFs written from a Hugging Face / sentence-transformers directory the way llama.cpp's
`convert_hf_to_gguf.py` writes them (`bert`, `nomic-bert`, `gemma-embedding`), offline.

What the converter does and this repeats, independently of the engine's own tables:
- names: gguf-py's tensor map (`encoder.layer.N.attention.self.query` -> `blk.N.attn_q`, nomic's
  `attn.Wqkv` -> `attn_qkv`, `mlp.fc11` -> `ffn_up`, Gemma's `pre_feedforward_layernorm` ->
  `ffn_norm`, ...); BERT's pooler and heads are dropped;
- values: Gemma's norms are stored as 1 + w; the Dense modules as `dense_2.weight` /
  `dense_3.weight`; 1-D tensors stay float32 whatever the file type; q8_0 where a row is a
  multiple of 32 values, float16 otherwise;
- WordPiece: word-initial pieces get a leading "▁", "##" continuations lose it;
- SentencePiece: pieces, scores and types from `tokenizer.model` (read here with a few lines of
  protobuf), then `added_tokens_decoder` re-types pieces (special ones, or ones that look
  special, CONTROL; others USER_DEFINED with their "▁" written as a space);
- `{arch}.pooling_type` from the Pooling module's config.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from tests.helpers.tiny_gguf import DECODER_NAMES

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_BERT = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_NOMIC = {
    "attn.Wqkv": "attn_qkv",
    "attn.out_proj": "attn_output",
    "norm1": "attn_output_norm",
    "mlp.fc11": "ffn_up",
    "mlp.fc12": "ffn_gate",
    "mlp.fc2": "ffn_down",
    "norm2": "layer_output_norm",
}
_GEMMA = {  # the decoders' attention and MLP names, and Gemma's four norms
    **{hf: name for hf, name in DECODER_NAMES.items() if hf.startswith(("self_attn.", "mlp."))},
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_TOP = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
    "emb_ln": "token_embd_norm",
    "embed_tokens": "token_embd",
    "norm": "output_norm",
}
_LAYERS = {
    "bert": (re.compile(r"^encoder\.layer\.(\d+)\.(.+)$"), _BERT),
    "nomic-bert": (re.compile(r"^encoder\.layers\.(\d+)\.(.+)$"), _NOMIC),
    "gemma-embedding": (re.compile(r"^layers\.(\d+)\.(.+)$"), _GEMMA),
}


def gguf_name(arch: str, hf: str) -> str | None:
    hf = hf.removeprefix("model.").removeprefix("bert.")
    if hf.startswith(("pooler.", "cls.", "lm_head.")) or hf.endswith("position_ids"):
        return None
    stem, kind = hf.rsplit(".", 1)
    pattern, parts = _LAYERS[arch]
    if m := pattern.match(stem):
        return f"blk.{m.group(1)}.{parts[m.group(2)]}.{kind}"
    return f"{_TOP[stem]}.{kind}"


def wordpiece_metadata(src: Path) -> dict[str, Any]:
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    special = {a["content"] for a in tok["added_tokens"] if a["special"]}
    pieces = [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [CONTROL if p in special else NORMAL for p in pieces]
    phantom = [
        p if k == CONTROL else p[2:] if p.startswith("##") else "\u2581" + p
        for p, k in zip(pieces, types, strict=True)
    ]
    return {
        "model": "bert", "tokens": phantom, "types": types, "bos": vocab["[CLS]"], "sep": vocab["[SEP]"],
        "unk": vocab["[UNK]"], "pad": vocab["[PAD]"], "add_bos": True, "add_eos": False,
    }  # fmt: skip


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if b < 0x80:
            return value, i


def _fields(buf: bytes) -> list[tuple[int, Any]]:
    """A protobuf message's (field number, value) pairs: varints, fixed32 as bytes, bytes."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        else:
            n, i = _varint(buf, i)
            value, i = buf[i : i + n], i + n
        out.append((key >> 3, value))
    return out


def sentencepiece_pieces(model_file: Path) -> list[tuple[str, float, int]]:
    """(piece, score, type) of each SentencePiece in a `tokenizer.model` (ModelProto field 1)."""
    pieces = []
    for number, value in _fields(model_file.read_bytes()):
        if number != 1:
            continue
        f = dict(_fields(value))
        pieces.append((f[1].decode("utf-8"), struct.unpack("<f", f.get(2, b"\0\0\0\0"))[0], int(f.get(3, 1))))
    return pieces


def sentencepiece_metadata(src: Path) -> dict[str, Any]:
    spm_type = {UNKNOWN: UNKNOWN, CONTROL: CONTROL, UNUSED: UNUSED, BYTE: BYTE}  # the rest: NORMAL
    pieces = sentencepiece_pieces(src / "tokenizer.model")
    tokens = [p for p, _, _ in pieces]
    types = [spm_type.get(t, NORMAL) for _, _, t in pieces]
    config = json.loads((src / "tokenizer_config.json").read_text())
    for key, data in config.get("added_tokens_decoder", {}).items():
        i, text = int(key), data["content"]
        if i >= len(tokens):
            continue
        looks_special = text.startswith(("<", "[")) and text.endswith((">", "]"))
        if data.get("special") or looks_special:
            tokens[i], types[i] = text, CONTROL
        else:
            tokens[i], types[i] = text.replace("\u2581", " "), USER_DEFINED
    ids = {p: i for i, p in reversed(list(enumerate(tokens)))}
    return {
        "model": "llama", "tokens": tokens, "types": types, "scores": [s for _, s, _ in pieces],
        "bos": ids[config["bos_token"]], "eos": ids[config["eos_token"]], "unk": ids[config["unk_token"]],
        "pad": ids[config["pad_token"]], "add_bos": bool(config.get("add_bos_token", True)),
        "add_eos": bool(config.get("add_eos_token", False)), "add_space_prefix": False,
    }  # fmt: skip


def _pooling_type(src: Path) -> int:
    cfg = json.loads((src / "1_Pooling" / "config.json").read_text())
    modes = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2, "pooling_mode_lasttoken": 3}
    return next(code for key, code in modes.items() if cfg.get(key))


def _add_tokenizer(w: Any, meta: dict[str, Any]) -> None:
    w.add_tokenizer_model(meta["model"])
    w.add_tokenizer_pre("default")
    w.add_token_list(meta["tokens"])
    w.add_token_types(meta["types"])
    if "scores" in meta:
        w.add_token_scores(meta["scores"])
        w.add_add_space_prefix(meta["add_space_prefix"])
    w.add_bos_token_id(meta["bos"])
    if "eos" in meta:
        w.add_eos_token_id(meta["eos"])
    if "sep" in meta:
        w.add_sep_token_id(meta["sep"])
    w.add_unk_token_id(meta["unk"])
    w.add_pad_token_id(meta["pad"])
    w.add_add_bos_token(meta["add_bos"])
    w.add_add_eos_token(meta["add_eos"])


def _add_tensor(w: Any, name: str, value: np.ndarray, qtype: str) -> None:
    import gguf

    value = value.astype(np.float32)
    if value.ndim == 1 or qtype == "f32":
        w.add_tensor(name, value)
    elif qtype == "q8_0" and value.shape[-1] % 32 == 0:
        q = gguf.GGMLQuantizationType.Q8_0
        w.add_tensor(name, gguf.quants.quantize(value, q), raw_dtype=q)
    else:
        w.add_tensor(name, value.astype(np.float16))


def write_encoder_gguf(dst: Path, src: Path, arch: str, qtype: str = "f32") -> Path:
    """`src` (a sentence-transformers directory) as a `{arch}` GGUF of file type `qtype`
    (f32 | f16 | q8_0)."""
    import gguf

    cfg = json.loads((src / "config.json").read_text())
    w = gguf.GGUFWriter(str(dst), arch)
    hidden = cfg.get("hidden_size") or cfg["n_embd"]
    w.add_embedding_length(hidden)
    w.add_block_count(cfg.get("num_hidden_layers") or cfg["n_layer"])
    w.add_head_count(cfg.get("num_attention_heads") or cfg["n_head"])
    w.add_feed_forward_length(cfg.get("intermediate_size") or cfg["n_inner"])
    w.add_pooling_type(gguf.PoolingType(_pooling_type(src)))
    if arch == "gemma-embedding":
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_rope_freq_base((cfg.get("rope_parameters") or {}).get("full_attention", {}).get("rope_theta")
                             or cfg["rope_theta"])  # fmt: skip
        w.add_sliding_window(cfg["sliding_window"])
        meta = sentencepiece_metadata(src) if (src / "tokenizer.model").is_file() else wordpiece_metadata(src)
    else:
        w.add_causal_attention(False)
        w.add_layer_norm_eps(cfg.get("layer_norm_eps") or cfg["layer_norm_epsilon"])
        w.add_token_type_count(cfg.get("type_vocab_size", 2))
        positions = cfg.get("max_trained_positions") or cfg.get("max_position_embeddings")
        w.add_context_length(min(positions, 2048) if arch == "nomic-bert" else positions)
        if arch == "nomic-bert":
            theta = cfg.get("rotary_emb_base") or (cfg.get("rope_parameters") or {}).get("rope_theta")
            w.add_rope_freq_base(theta)
        meta = wordpiece_metadata(src)
    _add_tokenizer(w, meta)
    for hf, value in load_file(str(src / "model.safetensors")).items():
        name = gguf_name(arch, hf)
        if name is None:
            continue
        if arch == "gemma-embedding" and hf.endswith("norm.weight"):
            value = value.astype(np.float32) + 1.0
        _add_tensor(w, name, value, qtype)
    for folder, name in (("2_Dense", "dense_2"), ("3_Dense", "dense_3")):
        if arch == "gemma-embedding" and (src / folder / "model.safetensors").is_file():
            weight = load_file(str(src / folder / "model.safetensors"))["linear.weight"]
            w.add_dense_features_dims(name, weight.shape[1], weight.shape[0])
            _add_tensor(w, f"{name}.weight", weight, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
