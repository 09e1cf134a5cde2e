"""Multi-vector (ColBERT) test directories saved by sentence-transformers' own
MultiVectorEncoder: all-MiniLM-L6-v2's real encoder weights and tokenizer, a seeded
`Dense(384 -> 128)` over token embeddings, the punctuation skiplist for documents, query
expansion to 32 tokens and a Normalize module; prompts "[unused0] " / "[unused1] "."""

from __future__ import annotations

import string
from pathlib import Path

import torch

from tests.helpers.tiny_bert import minilm_dir


def build_colbert(dst: Path, *, attend: bool = False, length: int = 32, seed: int = 0) -> Path:
    """Save the directory once (sentence-transformers writes every file: modules.json, 1_Dense,
    2_MultiVectorMask, 3_Normalize, sentence_bert_config.json's query_expansion)."""
    if (dst / "modules.json").exists():
        return dst
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Transformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    expansion = {"strategy": "fixed", "attend": attend, "length": length}
    transformer = Transformer(str(minilm_dir()), query_expansion=expansion, document_length=180)
    dense = Dense(
        384, 128, bias=False, activation_function=torch.nn.Identity(),
        module_input_name="token_embeddings", module_output_name="token_embeddings",
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        dense.linear.weight.copy_(torch.randn(dense.linear.weight.shape, generator=gen) / 384**0.5)
    model = MultiVectorEncoder(
        modules=[
            transformer, dense, MultiVectorMask(skiplist_words=list(string.punctuation)),
            Normalize(module_input_name="token_embeddings"),
        ],
        prompts={"query": "[unused0] ", "document": "[unused1] "},
        device="cpu",
    )  # fmt: skip
    model.save(str(dst))
    return dst


def decoder_colbert(src: Path, dst: Path, dim: int = 48, seed: int = 1) -> Path:
    """A decoder (the tiny Qwen3's weights and tokenizer) as a MultiVectorEncoder directory:
    Transformer -> Dense(hidden -> `dim`) over token embeddings -> MultiVectorMask (punctuation
    skiplist) -> Normalize; no query expansion. Chunked prefill, preemption, the layer-major
    lane and deterministic mode apply to it."""
    if (dst / "modules.json").exists():
        return dst
    import json
    import shutil

    from safetensors.torch import save_file

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("modules.json", "config_sentence_transformers.json"):
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    hidden = config.get("hidden_size") or config["text_config"]["hidden_size"]  # a Qwen3-VL's: its text's
    modules = [
        ("", "sentence_transformers.base.modules.transformer.Transformer"),
        ("1_Dense", "sentence_transformers.base.modules.dense.Dense"),
        (
            "2_MultiVectorMask",
            "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask",
        ),
        ("3_Normalize", "sentence_transformers.base.modules.normalize.Normalize"),
    ]
    (dst / "modules.json").write_text(
        json.dumps([{"idx": i, "name": str(i), "path": p, "type": t} for i, (p, t) in enumerate(modules)])
    )
    for folder, cfg in (
        ("1_Dense", {"in_features": hidden, "out_features": dim, "bias": True,
                     "activation_function": "torch.nn.modules.linear.Identity",
                     "module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}),
        ("2_MultiVectorMask", {"skiplist_words": list(string.punctuation), "skiplist_tasks": ["document"]}),
        ("3_Normalize", {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}),
    ):  # fmt: skip
        (dst / folder).mkdir()
        (dst / folder / "config.json").write_text(json.dumps(cfg))
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(dim, hidden, generator=gen) / hidden**0.5
    save_file({"linear.weight": weight, "linear.bias": 0.1 * torch.randn(dim, generator=gen)},
              str(dst / "1_Dense" / "model.safetensors"))  # fmt: skip
    (dst / "config_sentence_transformers.json").write_text(
        json.dumps({"model_type": "MultiVectorEncoder", "prompts": {"query": "Query: "}})
    )
    return dst


def build_pylate(dst: Path, seed: int = 2) -> Path:
    """A PyLate v3 save, written as PyLate wrote it: all-MiniLM-L6-v2's encoder and tokenizer,
    modules.json listing only the Transformer and `pylate.models.Dense.Dense`, and the flat
    config (model_type "ColBERT", "[unused0]" / "[unused1]" prefixes inserted as tokens, query
    expansion to 32 tokens, document_length, the skiplist implied)."""
    if (dst / "modules.json").exists():
        return dst
    import json
    import shutil

    from safetensors.torch import save_file

    from tests.helpers.tiny_bert import TOKENIZER_FILES

    dst.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", *TOKENIZER_FILES):
        shutil.copy(minilm_dir() / name, dst / name)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 179, "do_lower_case": False})
    )
    (dst / "1_Dense").mkdir()
    (dst / "1_Dense" / "config.json").write_text(
        json.dumps({"in_features": 384, "out_features": 96, "bias": False,
                    "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False})
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(96, 384, generator=gen) / 384**0.5
    save_file({"linear.weight": weight}, str(dst / "1_Dense" / "model.safetensors"))
    (dst / "config_sentence_transformers.json").write_text(
        json.dumps({
            "model_type": "ColBERT", "query_prefix": "[unused0]", "document_prefix": "[unused1]",
            "query_length": 32, "document_length": 180, "attend_to_expansion_tokens": False,
            "similarity_fn_name": "MaxSim", "prompts": {}, "default_prompt_name": None,
        })
    )  # fmt: skip
    return dst
