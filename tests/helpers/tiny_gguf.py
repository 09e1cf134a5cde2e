"""Tiny GGUF files written the way llama.cpp's converter writes them (offline, in seconds).

A small byte-level BPE is trained on real text (Python's help() topics), a tiny random decoder is saved as a
Hugging Face directory (the reference), and its weights are written to GGUF under llama.cpp's
names, with llama's Q/K rows interleaved as `convert_hf_to_gguf.py` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.helpers.real_text import documents
from tests.helpers.tiny_models import build_decoder

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOS = "<|endoftext|>"

# Hugging Face name fragment -> llama.cpp tensor name fragment (written independently of the
# engine's own table, so a wrong entry there cannot hide behind the same wrong entry here).
DECODER_NAMES = {
    "embed_tokens": "token_embd",
    "norm": "output_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def train_tokenizer(vocab_size: int = 800) -> Tokenizer:
    """Byte-level BPE with the Qwen2 split and `<|endoftext|>` as its last id."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(documents(), trainer)
    tok.add_special_tokens([EOS])
    return tok


def tokenizer_metadata(tok: Tokenizer) -> dict[str, Any]:
    """The `tokenizer.ggml.*` values llama.cpp would write for this tokenizer."""
    model = json.loads(tok.to_str())["model"]
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    eos = vocab[EOS]
    return {"tokens": tokens, "types": [3 if t == EOS else 1 for t in tokens], "merges": merges, "eos": eos}


def _gguf_name(hf: str) -> str:
    name = hf.removeprefix("model.")
    stem, kind = name.rsplit(".", 1)
    if stem.startswith("layers."):
        _, layer, part = stem.split(".", 2)
        return f"blk.{layer}.{DECODER_NAMES[part]}.{kind}"
    return f"{DECODER_NAMES[stem]}.{kind}"


def interleave_rope_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to llama Q/K: per head, halves become interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    dst: Path,
    hf_dir: Path,
    arch: str,
    tok_meta: dict[str, Any],
    *,
    add_eos: bool = False,
    f16: bool = False,
    q8_0: bool = False,
) -> Path:
    """`hf_dir`'s weights as llama.cpp's converter writes them: float32, or its 2-D tensors
    float16 (`f16`) or Q8_0 (`q8_0`, as gguf's quantizer rounds them)."""
    import gguf

    cfg = json.loads((hf_dir / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = gguf.GGUFWriter(str(dst), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tok_meta["tokens"])
    w.add_token_types(tok_meta["types"])
    w.add_token_merges(tok_meta["merges"])
    w.add_eos_token_id(tok_meta["eos"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(add_eos)
    for name, value in load_file(str(hf_dir / "model.safetensors")).items():
        if name.startswith("lm_head."):
            continue
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            value = interleave_rope_rows(value, heads if ".q_proj." in name else kv_heads)
        # llama.cpp keeps 1-D tensors (norms, biases) in float32 whatever the file type.
        if q8_0 and value.ndim == 2:
            kind = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(
                _gguf_name(name), gguf.quants.quantize(value.astype(np.float32), kind), raw_dtype=kind
            )
            continue
        w.add_tensor(_gguf_name(name), value.astype(np.float16 if f16 and value.ndim == 2 else np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def build_gguf_pair(root: Path, arch: str, tok: Tokenizer, **kwargs: Any) -> tuple[Path, Path]:
    """(Hugging Face reference directory, GGUF file of the same weights)."""
    vocab = tok.get_vocab_size(with_added_tokens=True)
    hf_dir = build_decoder(root / arch, arch, seed=11, st_files=False, extra={"vocab_size": vocab})
    return hf_dir, write_gguf(root / f"{arch}.gguf", hf_dir, arch, tokenizer_metadata(tok), **kwargs)
