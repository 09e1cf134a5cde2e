"""Builds an engine's parts in three stages: resolve the options against the model's files (pure,
engine/resolve.py), load the model (engine/load.py), then pick the runner and assemble the core."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from embedserve.attention.metadata import AttentionFn
from embedserve.config import EngineConfig
from embedserve.engine.adapters import Adapters
from embedserve.engine.core import EngineCore
from embedserve.engine.load import Loaded, load
from embedserve.engine.options import EngineOptions
from embedserve.engine.quantize import Prober, quantize_engine
from embedserve.engine.resolve import resolve
from embedserve.errors import ModelLoadError
from embedserve.kv_cache.manager import KVCacheManager
from embedserve.models.decoder import DecoderModel
from embedserve.models.lexical_head import LexicalHead, load_lexical_head, unused_ids
from embedserve.models.multivector import MultiVectorHead, load_multivector_head
from embedserve.models.open import open_model
from embedserve.models.registry import CLASSIFIER, YES_NO
from embedserve.models.score_head import ScoreHead, load_score_head
from embedserve.models.source import ModelSource, override_pooling
from embedserve.models.sparse_head import SparseHead, load_sparse_head
from embedserve.models.static_queries import StaticQueries
from embedserve.parallel.runner import TensorParallelRunner
from embedserve.pooling.dense import DenseHead
from embedserve.pooling.outputs import Output, supported_outputs
from embedserve.scheduler.scheduler import Scheduler
from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.multimodal import MultimodalPrompter, multimodal_prompter
from embedserve.tokenizer.spec import RenderSpec
from embedserve.worker.bucketed_runner import BucketedModelRunner
from embedserve.worker.lane_runner import LaneRunner
from embedserve.worker.model_runner import ModelRunner
from embedserve.worker.multimodal_runner import MultimodalRunner


@dataclass
class EngineParts:
    config: EngineConfig
    core: EngineCore  # synchronous; `Engine` runs it in a background thread
    tokenizer: Tokenizer
    score_head: ScoreHead | None = None  # rerankers and classifiers only
    sparse_head: SparseHead | None = None  # SPLADE models only (their pooling folds through it)
    workers: TensorParallelRunner | None = None  # tensor_parallel_size > 1: the ranks to watch and stop
    prompter: MultimodalPrompter | None = None  # multimodal models: parts -> tokens + images
    lexical_head: LexicalHead | None = None  # BGE-M3: sparse vectors beside its dense ones
    multivector_head: MultiVectorHead | None = None  # ColBERT, BGE-M3: a vector per token
    static_queries: StaticQueries | None = None  # inference-free SPLADE: queries without the model
    dense_head: DenseHead | None = None  # sentence-transformers Dense modules after pooling
    adapters: Adapters | None = None  # LoRA adapters served on the weights (engine/adapters.py)
    outputs: frozenset[Output] = frozenset({Output.DENSE})  # what the model emits (pooling/outputs.py)

    def render_spec(self) -> RenderSpec:
        """What rendering inputs reads of the loaded model (tokenizer/spec.py; the gateway's counter
        makes the same from the model's files)."""
        cfg, score, tokens = self.config, self.score_head, self.multivector_head
        return RenderSpec(
            self.tokenizer, cfg.scheduler.max_model_len, cfg.prompts, cfg.default_prompt_name,
            task=cfg.task, score_kind=None if score is None else score.kind,
            num_labels=score.num_labels if score is not None and score.kind == CLASSIFIER else 0,
            pair_types=cfg.model.type_vocab_size > 1,
            causal=cfg.model.is_causal or cfg.model.causal_mask,
            dense_after_pooling=self.dense_head is not None, prompter=self.prompter,
            static=self.static_queries, token_vectors=tokens, vector_size=cfg.vector_size,
            token_dim=None if tokens is None else tokens.dim, outputs=self.outputs,
        )  # fmt: skip


def build_engine(
    path: str | Path | ModelSource,
    options: EngineOptions | None = None,
    *,
    attention: AttentionFn | None = None,
    **overrides: Any,
) -> EngineParts:
    """The engine's parts for `options` (engine/options.py), any field also given as a keyword
    override. `attention` forces an attention route (default: attention/select.py's choice per
    device and dtype); tests and GPU benchmarks use it."""
    options = (options or EngineOptions()).replace(**overrides)
    if isinstance(path, ModelSource):  # already opened, e.g. random weights made on the GPU
        files = replace(path, pooling=override_pooling(path.pooling, options.pooling, options.normalize))
    else:
        files = open_model(path, pooling=options.pooling, normalize=options.normalize)
    loaded = load(resolve(options, files, attention), files, attention)
    config = loaded.config
    core = new_core(config, pick_runner(loaded), _lane(loaded))
    tokenizer = Tokenizer(files.tokenizer(), config.model.vocab_size)
    prompter = None
    if config.multimodal:
        prompter = multimodal_prompter(files, config.max_image_pixels, config.max_images_per_input)
    sparse = None
    if config.pooling.splade is not None:
        sparse = load_sparse_head(files.weights(), config.model, *config.pooling.splade)
    score = _score_head(config, files, tokenizer)
    static = (
        None if files.query_encoder is None else StaticQueries(files.query_encoder, config.model.vocab_size)
    )
    lexical = None
    if files.lexical_head is not None:
        specials = unused_ids(files.lexical_head.parent, tokenizer.backend)
        model = config.model
        lexical = load_lexical_head(files.lexical_head, model.hidden_size, model.vocab_size, specials)
    multivector = None
    if files.multivector is not None:
        multivector = load_multivector_head(files.multivector, config.model.hidden_size, tokenizer.backend)
    dense = DenseHead(config.pooling.dense) if config.pooling.dense else None
    if dense is not None and (lexical or multivector or sparse or score):
        # their requests reuse the dense path's params (engine/lexical.py, engine/multivector.py)
        raise ModelLoadError("Dense modules after pooling apply to single dense vectors only")
    if loaded.adapters is not None:
        loaded.adapters.load_initial()
    parts = EngineParts(
        config, core, tokenizer, score, sparse, loaded.workers, prompter,
        static_queries=static, lexical_head=lexical, multivector_head=multivector, dense_head=dense,
        adapters=loaded.adapters, outputs=_outputs(score, sparse, lexical, multivector, prompter is None),
    )  # fmt: skip
    if config.quantization is not None:
        fresh = functools.partial(new_core, config, core.runner, core.lane, cached=False)
        quantize_engine(
            loaded.model, parts.outputs, Prober(config, fresh, tokenizer, dense), config.quantization
        )
    return parts


def _outputs(
    score: ScoreHead | None,
    sparse: SparseHead | None,
    lexical: LexicalHead | None,
    tokens: MultiVectorHead | None,
    text_only: bool,
) -> frozenset[Output]:
    """What the model emits, from the heads it loaded (pooling/outputs.py)."""
    classifies = score is not None and score.kind == CLASSIFIER
    return supported_outputs(
        sparse=sparse is not None, lexical=lexical is not None,
        multivector_only=None if tokens is None else tokens.only,
        scores=score is not None and (not classifies or score.num_labels == 1), labels=classifies,
        text_only=text_only,
    )  # fmt: skip


def new_core(
    config: EngineConfig, runner: ModelRunner, lane: LaneRunner | None, cached: bool = True
) -> EngineCore:
    """A core over `runner` with a scheduler and KV block manager of its own (`cached`: with the
    prefix cache the config sizes; a load-time probe runs on one without)."""
    cache = config.cache
    kv = KVCacheManager(cache.num_blocks, cache.block_size, cache.max_cached_blocks if cached else 0)
    return EngineCore(Scheduler(config.scheduler, kv, config.model.num_hidden_layers), runner, lane)


def pick_runner(loaded: Loaded) -> ModelRunner:
    """The runner for the config: the ranks' (tensor parallelism), the multimodal one (images
    per step), the bucketed one (fixed step sizes, torch.compile), else the plain one."""
    config, model = loaded.config, loaded.model
    if loaded.workers is not None:
        return loaded.workers
    if config.multimodal:
        return MultimodalRunner.for_config(model, config)
    if config.token_buckets is not None:
        return BucketedModelRunner.for_config(model, config)
    return ModelRunner.for_config(model, config)


def _lane(loaded: Loaded) -> LaneRunner | None:
    """The layer-major lane of long prompts (CPU decoders, resolve.py decides)."""
    config = loaded.config
    if config.scheduler.layer_major_tokens is None:
        return None
    assert isinstance(loaded.model, DecoderModel)
    budget = config.scheduler.max_num_batched_tokens
    return LaneRunner(loaded.model, budget, config.device, config.scheduler.deterministic_chunk)


def _score_head(config: EngineConfig, files: ModelSource, tokenizer: Tokenizer) -> ScoreHead | None:
    """A reranker's or classifier's head (None for an embedding model): a classifier, or the yes / no rows."""
    kind = config.rerank_kind
    if kind is None:
        return None
    yes_no = None
    if kind == YES_NO:
        ids = [tokenizer.backend.token_to_id(t) for t in ("yes", "no")]
        if None in ids:
            raise ModelLoadError("the tokenizer has no 'yes' / 'no' token for a yes / no reranker")
        yes_no = (int(ids[0] or 0), int(ids[1] or 0))
    return load_score_head(kind, files.weights(), yes_no, config.model)
