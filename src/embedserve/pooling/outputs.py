"""What a loaded model emits: the one vocabulary (`Output`) that routes, embedders and the index
ask (`Engine.outputs`), instead of probing which of the engine's heads were loaded.

    a dense model          DENSE, SPANS                 (SPANS: text models; late chunking)
    SPLADE                 SPARSE                       (inference-free too: its queries skip the model)
    BGE-M3                 DENSE, LEXICAL, MULTIVECTOR  (its lexical weights are its sparse vectors)
    ColBERT                MULTIVECTOR                  (multi-vectors only)
    a reranker             SCORES
    a classifier           LABELS                       (one label: SCORES too, its rerank score)
"""

from __future__ import annotations

import enum


class Output(str, enum.Enum):
    DENSE = "dense"  # one vector per input (pooled; Dense modules after it)
    SPARSE = "sparse"  # SPLADE: one vocabulary-weight vector per input, the model's only vector
    LEXICAL = "lexical"  # BGE-M3: lexical (vocabulary) weights beside its dense vectors
    MULTIVECTOR = "multivector"  # a vector per kept token, scored by MaxSim
    SPANS = "spans"  # late chunking: a vector per chunk of one document (a text model's DENSE rows)
    SCORES = "scores"  # one relevance score per (query, document) pair
    LABELS = "labels"  # a probability per label


def supported_outputs(
    *,
    sparse: bool,
    lexical: bool,
    multivector_only: bool | None,
    scores: bool,
    labels: bool,
    text_only: bool = True,
) -> frozenset[Output]:
    """The outputs of a model with these heads: `multivector_only` None without a multi-vector
    head, True where it is the model's only output (ColBERT), False beside single vectors (BGE-M3);
    `scores` / `labels`: its score head reranks / classifies (engine/rerank.py, engine/classify.py);
    `text_only`: it takes no images (late chunking pools text spans)."""
    if scores or labels:
        return frozenset(o for o, has in ((Output.SCORES, scores), (Output.LABELS, labels)) if has)
    out = {Output.SPARSE if sparse else Output.DENSE}
    if text_only and not sparse:
        out.add(Output.SPANS)
    if lexical:
        out.add(Output.LEXICAL)
    if multivector_only is not None:
        out.add(Output.MULTIVECTOR)
        if multivector_only:
            out -= {Output.DENSE, Output.SPANS}
    return frozenset(out)


def multivectors_only(outputs: frozenset[Output]) -> bool:
    """Multi-vectors are the model's only vectors (ColBERT; BGE-M3 answers single ones too)."""
    return Output.MULTIVECTOR in outputs and Output.DENSE not in outputs
