"""Read a local Hugging Face / sentence-transformers model directory.

config.json                          architecture numbers
model.safetensors | *.index.json     weights (single file or sharded)
tokenizer.json                       tokenizer
modules.json                         sentence-transformers pipeline (optional)
1_Pooling/config.json                pooling mode, include_prompt
config_sentence_transformers.json    prompts, default prompt name
sentence_bert_config.json            max_seq_length
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer as HFTokenizer

from embedserve.config import DenseLayer, PoolingConfig, PoolingMethod
from embedserve.errors import ModelLoadError
from embedserve.models.multivector_rules import (
    MULTIVECTOR_MODULES,
    legacy_prefixes,
    multivector_root,
    register_prefixes,
)
from embedserve.models.registry import model_config_from_hf, sliding_window
from embedserve.models.router import router_dirs
from embedserve.models.source import ModelSource, default_pooling, override_pooling
from embedserve.models.st_dense import SENTENCE, input_name, module_config, read_dense, read_json

if TYPE_CHECKING:
    import torch

    from embedserve.models.qwen3_vl.spec import Qwen3VLSpec

# SparseEncoder directories (SPLADE): MLMTransformer, or Transformer with transformer_task
# "fill-mask", then SpladePooling.
_ST_MODULES = ("Transformer", "Pooling", "Normalize", "MLMTransformer", "SpladePooling")
LEXICAL_FILE = "sparse_linear.pt"  # BGE-M3's lexical weights head (models/lexical_head.py)


@dataclass(frozen=True, kw_only=True)
class ModelFiles(ModelSource):
    tokenizer_file: Path
    weight_files: list[Path]
    prefix_tokens: tuple[str, ...] = ()  # PyLate v3's query / document prefixes (models/multivector.py)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter_weights(self.weight_files)

    def tokenizer(self) -> HFTokenizer:
        try:
            tokenizer = HFTokenizer.from_file(str(self.tokenizer_file))
        except Exception as e:  # tokenizers raises a bare Exception for malformed files
            raise ModelLoadError(f"cannot read tokenizer {self.tokenizer_file}: {e}") from e
        register_prefixes(tokenizer, self.prefix_tokens)
        return tokenizer


def _pooling_from_st(root: Path, default: PoolingConfig, hidden: int) -> PoolingConfig | None:
    """Pooling, Dense modules and normalization as sentence-transformers would apply them, if
    configured. Each module follows its `module_input_name` (models/st_dense.py)."""
    modules_file = root / "modules.json"
    if not modules_file.exists():
        return None
    method, include_prompt, normalize, splade = default.method, True, False, None
    dense: list[DenseLayer] = []
    # A multi-vector model's Dense and MultiVectorMask are its token head (models/multivector.py).
    multivector = multivector_root(root) is not None
    accepted = _ST_MODULES + (MULTIVECTOR_MODULES if multivector else ("Dense",))
    for module in read_json(modules_file):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in accepted:
            raise ModelLoadError(
                f"sentence-transformers module {module.get('type')!r} is not supported; "
                f"supported modules: {', '.join((*_ST_MODULES, 'Dense'))}"
            )
        if kind == "Normalize" and input_name(module_config(root, module)) == SENTENCE:
            normalize = True
        elif kind == "Dense" and not multivector:
            if normalize:
                raise ModelLoadError(f"{root}: a Dense module after Normalize is not supported")
            dense.append(read_dense(root, module, dense[-1].out_features if dense else hidden))
        elif kind == "Pooling":
            cfg = read_json(root / module.get("path", "1_Pooling") / "config.json")
            method = _pooling_mode(cfg)
            include_prompt = bool(cfg.get("include_prompt", True))
        elif kind == "SpladePooling":
            cfg = read_json(root / module.get("path", "1_SpladePooling") / "config.json")
            method = PoolingMethod.SPLADE
            splade = _splade(cfg)
    return PoolingConfig(method, normalize, include_prompt, splade, tuple(dense))


def _splade(cfg: dict[str, Any]) -> tuple[str, str]:
    """SpladePooling's config: (activation, pooling strategy)."""
    return str(cfg.get("activation_function", "relu")), str(cfg.get("pooling_strategy", "max"))


def _pooling_mode(cfg: dict[str, Any]) -> PoolingMethod:
    # sentence-transformers >= 6 writes "pooling_mode"; older versions write one flag per mode.
    modes = (
        [cfg["pooling_mode"]]
        if "pooling_mode" in cfg
        else [k.removeprefix("pooling_mode_") for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
    )
    names = {
        "lasttoken": PoolingMethod.LAST,
        "mean_tokens": PoolingMethod.MEAN,
        "mean": PoolingMethod.MEAN,
        "cls_token": PoolingMethod.CLS,
        "cls": PoolingMethod.CLS,
    }
    if len(modes) != 1 or modes[0] not in names:
        raise ModelLoadError(f"unsupported pooling mode {modes}; supported: lasttoken, mean, cls")
    return names[modes[0]]


def _weight_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(read_json(index)["weight_map"].values()))
        files = [root / s for s in shards]
    elif (root / "model.safetensors").exists():
        files = [root / "model.safetensors"]
    else:
        raise ModelLoadError(
            f"no model.safetensors or model.safetensors.index.json in {root} "
            "(only safetensors weights are supported)"
        )
    for f in files:
        if not f.exists():
            raise ModelLoadError(f"weight shard {f.name} listed in the index is missing")
    return files


def read_model_dir(path: str | Path, pooling: str | None = None, normalize: bool | None = None) -> ModelFiles:
    root = Path(path)
    if not root.is_dir():
        raise ModelLoadError(f"model path {root} is not a directory")
    routed = router_dirs(root)
    if routed is not None:  # inference-free SPLADE: the document side's model, the query module beside
        files = read_model_dir(routed.document, pooling, normalize)
        splade = _splade(read_json(routed.pooling / "config.json"))
        pool = override_pooling(PoolingConfig(PoolingMethod.SPLADE, False, True, splade), pooling, normalize)
        prompts, default_prompt_name = _prompts(root)
        prompts = {"query": "", "document": "", **prompts}  # the routes a request names (models/router.py)
        return replace(
            files, path=root, pooling=pool, prompts=prompts, default_prompt_name=default_prompt_name,
            query_encoder=routed.query,
        )  # fmt: skip
    if not (root / "config.json").exists():
        raise ModelLoadError(f"{root} has no config.json")
    raw = read_json(root / "config.json")
    model = model_config_from_hf(raw)
    tokenizer_file = root / "tokenizer.json"
    if not tokenizer_file.exists():
        raise ModelLoadError(f"{root} has no tokenizer.json")
    fallback = default_pooling(model)
    configured = _pooling_from_st(root, fallback, model.hidden_size)
    pool = override_pooling(configured or fallback, pooling, normalize)
    prompts, default_prompt_name = _prompts(root)
    prefixes = legacy_prefixes(root)  # PyLate v3: a side's prefix token, then its prompt text
    prompts.update({side: p + prompts.get(side, "").removeprefix(p) for side, p in prefixes.items()})
    bert_cfg = root / "sentence_bert_config.json"
    max_seq = read_json(bert_cfg).get("max_seq_length") if bert_cfg.exists() else None
    return ModelFiles(
        path=root,
        model=model,
        pooling=pool,
        tokenizer_file=tokenizer_file,
        weight_files=_weight_files(root),
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        max_seq_length=int(max_seq) if max_seq else None,
        sliding_window=sliding_window(raw),
        multimodal=_multimodal(raw, root) if model.model_type == "qwen3_vl" else None,
        lexical_head=root / LEXICAL_FILE if (root / LEXICAL_FILE).exists() else None,
        multivector=multivector_root(root),
        prefix_tokens=tuple(prefixes.values()),
    )


def _prompts(root: Path) -> tuple[dict[str, str], str | None]:
    """The prompt table and default prompt name of config_sentence_transformers.json."""
    st_cfg = root / "config_sentence_transformers.json"
    if not st_cfg.exists():
        return {}, None
    meta = read_json(st_cfg)
    prompts = {str(k): str(v) for k, v in (meta.get("prompts") or {}).items()}
    return prompts, meta.get("default_prompt_name")


def _multimodal(raw: dict[str, Any], root: Path) -> Qwen3VLSpec:
    from embedserve.models.qwen3_vl.spec import read_spec  # PIL only for vision models

    return read_spec(raw, root)


def iter_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every shard's tensors, each read when asked for (models/tensor_file.py: no memory map,
    so loading peaks at the parameters plus one tensor, not plus the files)."""
    # torch only here: opening a model (its config, tokenizer) stays torch-free (the gateway's counter)
    from embedserve.models.tensor_file import read_tensors

    for f in files:
        yield from read_tensors(f)
