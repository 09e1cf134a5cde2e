"""`quantization="int8"` (the projections run int8: models/int8_linear.py) and
`quantization="int8-weights"` (their weights are int8, the arithmetic float32:
models/weight_int8.py), calibrated and gated at load, before the engine serves a request.

1. The probe texts below run in float32 (int8: while every projection records the largest |x|
   of each of its input channels; which channels are outliers is a property of the weights: a
   few sentences find them).
2. Every projection turns int8 (int8: its outlier channels from those magnitudes).
3. The probe texts run again: each quantized vector's cosine to its float32 vector must reach
   `MIN_COSINE`, else ModelLoadError naming the figure. An engine never serves vectors that
   drifted from what its float32 weights give, whatever the model.

Where a quantization does not apply it is refused by name; where int8 cannot pay (this PyTorch
has no working oneDNN int8 matmul, or the CPU no int8 dot products: VNNI, AMX-INT8; without
them int8 is no faster than float32, EMBEDSERVE_CPU_INT8=1 overrides), the engine says so and
runs float32 (its schema and profile then say so too). int8-weights runs everywhere: on the
kernel of kernels/weight_int8.py where it built, else on weights widened per call.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from embedserve.engine.load import short_steps
from embedserve.errors import ModelLoadError
from embedserve.kernels import isa, weight_int8
from embedserve.models.int8_linear import int8_available, int8_isa
from embedserve.models.linear import Linear
from embedserve.pooling.outputs import Output
from embedserve.request import EmbedParams, Request
from embedserve.settings import settings
from embedserve.tokenizer import Truncate
from embedserve.worker.host_memory import packed_on_huge_pages, release_free_heap

if TYPE_CHECKING:
    from collections.abc import Callable

    from embedserve.config import EngineConfig
    from embedserve.engine.core import EngineCore
    from embedserve.engine.options import EngineOptions
    from embedserve.models.build import EmbeddingModel
    from embedserve.models.source import ModelSource
    from embedserve.pooling.dense import DenseHead
    from embedserve.tokenizer import Tokenizer

log = logging.getLogger(__name__)

INT8, INT8_WEIGHTS = "int8", "int8-weights"
MIN_COSINE = 0.995  # the lowest cosine of a quantized probe vector to its float32 one
PROBE_TOKENS = 512  # probe texts are cut here (the longest two run past it on most tokenizers)

_SENTENCES = (
    "What is the capital of France?",
    "The boundary layer separates from the wing surface at high angles of attack.",
    "def embed(texts): return model.encode(texts, normalize_embeddings=True)",
    "Quarterly revenue rose 12% to $4.2 billion, beating analysts' estimates.",
    "Die Katze sitzt auf der Matte und schaut aus dem Fenster.",
    "A patient presented with acute chest pain radiating to the left arm.",
    "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 10;",
    "how do i reset my password",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The committee adjourned without reaching a decision on the budget proposal.",
    "Error: connection refused (ECONNREFUSED) while contacting 127.0.0.1:8080",
    "Los precios de la vivienda subieron un 5 por ciento el año pasado.",
    "Heat transfer to a flat plate in supersonic flow was measured at Mach 3.",
    "She walked along the beach at sunset, listening to the waves.",
    "1. Preheat the oven. 2. Mix flour and eggs. 3. Bake for 20 minutes.",
    "Neural retrieval models map queries and documents into one vector space.",
)
PROBES = (*_SENTENCES, " ".join(_SENTENCES), " ".join(reversed(_SENTENCES)) * 2)


def resolve_quantization(options: EngineOptions, files: ModelSource) -> str | None:
    """The quantization the engine runs: None, "int8" or "int8-weights" (ModelLoadError naming
    what it does not combine with; int8: None with a warning where it cannot pay here)."""
    name = options.quantization
    if name is None:
        return None
    refusal = next((why for when, why in _refusals(options, files) if when), None)
    if refusal is not None:
        raise ModelLoadError(f"quantization={name!r} {refusal}")
    if name == INT8_WEIGHTS:
        return name
    missing = int8_available() or _no_dot_products()
    if missing is not None:
        log.warning("quantization='int8' falls back to float32: %s", missing)
        return None
    return options.quantization


def _no_dot_products() -> str | None:
    """Why int8 would not pay on this CPU (no VNNI / AMX-INT8 under the ISA cap), unless
    EMBEDSERVE_CPU_INT8=1 asks for it anyway; None where it pays."""
    if settings().cpu_int8 or isa.int8_dot_products():
        return None
    return (
        "this CPU has no int8 dot products (VNNI, AMX-INT8; as capped by EMBEDSERVE_CPU_ISA): its int8"
        " matmuls run no faster than float32 and a short query slower (docs/quantization.md);"
        " EMBEDSERVE_CPU_INT8=1 runs int8 anyway"
    )


def _refusals(options: EngineOptions, files: ModelSource) -> list[tuple[bool, str]]:
    return [
        (options.device != "cpu", "runs on the CPU: device must be cpu"),
        (options.dtype != "float32", "computes in float32: dtype must be float32"),
        (options.tensor_parallel_size > 1, "is not available with tensor_parallel_size > 1"),
        (options.enable_lora or bool(options.lora_modules), "does not combine with LoRA adapters"),
        (options.compile_backend is not None, "does not combine with compile_backend"),
        (files.multimodal is not None, "is not available for multimodal models"),
        (
            options.deterministic and options.quantization == INT8_WEIGHTS,
            "does not combine with deterministic mode (short steps sum in another order than long ones)",
        ),
    ]


@dataclass(frozen=True)
class Prober:
    """What runs the probe texts: a core of their own over the engine's runner (its scheduler,
    KV block manager without a prefix cache, counters and timings never those that serve)."""

    config: EngineConfig
    new_core: Callable[[], EngineCore]
    tokenizer: Tokenizer
    dense_head: DenseHead | None

    def vectors(self) -> np.ndarray:
        """The probe texts' unit vectors, run synchronously, each cut at `PROBE_TOKENS` tokens
        (the same calibration whatever the engine's max_model_len)."""
        core, finished = self.new_core(), []
        limit = min(PROBE_TOKENS, self.config.scheduler.max_model_len)
        for i, text in enumerate(PROBES):
            tokens = self.tokenizer.encode(text, limit, Truncate.END)
            params = EmbedParams(normalize=True, dense=self.dense_head)
            core.add(Request(i, tokens.token_ids, params, self.config.pooling.method))
        while core.has_work:
            finished += core.step()
        vectors = []
        for f in sorted(finished, key=lambda f: f.request.request_id):
            if f.vector is None:
                raise ModelLoadError(f"quantization: a probe text failed to embed: {f.error}")
            vectors.append(f.vector.float().numpy())
        return np.stack(vectors)


def quantize_engine(model: EmbeddingModel, outputs: frozenset[Output], prober: Prober, name: str) -> None:
    """Calibrate, turn every projection int8 (`name`: int8 or int8-weights), then gate the
    probe vectors (module docstring)."""
    vectors = outputs - {Output.SPANS}  # late chunks pool the same dense rows
    if vectors != {Output.DENSE}:
        emits = ", ".join(sorted(o.value for o in vectors))
        raise ModelLoadError(f"quantization={name!r} serves dense embedding models; this model emits {emits}")
    started = time.perf_counter()
    projections = [m for m in model.modules() if isinstance(m, Linear)]
    if name == INT8:
        magnitudes: dict[Linear, torch.Tensor] = {}
        for m in projections:
            m.observe = _recorder(magnitudes, m)
        try:
            reference = prober.vectors()
        finally:
            for m in projections:
                m.observe = None
        for m in projections:
            m.to_int8(magnitudes[m])
        what = f"int8: {len(projections)} projections on {int8_isa()}"
    else:
        reference = prober.vectors()
        forms = Counter(m.to_weights8() for m in projections)
        release_free_heap()  # the float weights' pages back to the OS
        packed_on_huge_pages(model)  # each short step reads the int8 weights whole: fewer page walks
        short_steps(model, prober.config)  # the probes below run as served steps will
        kernel = (
            "the int8-weight kernel"
            if weight_int8.available()
            else "weights widened per call (no kernel here)"
        )
        counts = ", ".join(f"{forms[f]} {f}" for f in sorted(forms))
        what = f"int8 weights: {len(projections)} projections ({counts}), short rows on {kernel}"
    cosines = np.sum(prober.vectors() * reference, axis=1)
    low, mid = float(cosines.min()), float(np.median(cosines))
    if low < MIN_COSINE:
        raise ModelLoadError(
            f"quantization={name!r} drifts too far from float32 for this model: the lowest cosine of "
            f"{len(cosines)} probe vectors is {low:.5f} (median {mid:.5f}), below the gate {MIN_COSINE}; "
            "serve it in float32 or bfloat16"
        )
    log.info(
        "%s; probe cosine to float32 min %.5f, median %.5f (gate %s), %.1f s",
        what, low, mid, MIN_COSINE, time.perf_counter() - started,
    )  # fmt: skip


def _recorder(magnitudes: dict[Linear, torch.Tensor], m: Linear) -> Callable[[torch.Tensor], None]:
    def observe(x: torch.Tensor) -> None:
        if x.numel() == 0:  # a step whose chunks pool no row here (a decoder's last layer)
            return
        seen = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
        before = magnitudes.get(m)
        magnitudes[m] = seen if before is None else torch.maximum(before, seen)

    return observe
