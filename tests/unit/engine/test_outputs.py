"""What a loaded model emits (pooling/outputs.py): `Engine.outputs` for each kind of model, the
vocabulary routes, embedders and the index ask instead of probing the engine's heads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from embedserve import Engine
from embedserve.engine.ask import Ask
from embedserve.errors import InvalidInputError
from embedserve.pooling.outputs import Output, multivectors_only
from tests.helpers.tiny_bert import build_encoder
from tests.helpers.tiny_models import build_decoder
from tests.helpers.tiny_multivector import build_colbert
from tests.helpers.tiny_rerankers import build_cross_encoder, build_qwen3_reranker
from tests.helpers.tiny_sparse import build_bge_m3, build_inference_free, build_splade

D, S, L, M, P = Output.DENSE, Output.SPARSE, Output.LEXICAL, Output.MULTIVECTOR, Output.SPANS
# One input of each output's kind, as `Engine.run` takes it.
INPUTS = {
    D: ["a b c"],
    S: ["a b c"],
    L: ["a b c"],
    M: ["a b c"],
    P: ["one two", " three"],
    Output.SCORES: ("q", ["d"]),
}


def _free(dst: Path) -> Path:
    return build_inference_free(dst, build_splade(dst.parent / "splade_for_free"))


CASES: list[tuple[str, Callable[[Path], Path], dict[str, str], set[Output]]] = [
    ("decoder", build_decoder, {}, {D, P}),
    ("encoder", build_encoder, {}, {D, P}),
    ("splade", build_splade, {}, {S}),
    ("inference_free", _free, {}, {S}),
    ("bge_m3", build_bge_m3, {}, {D, L, M, P}),
    ("colbert", build_colbert, {}, {M}),
    ("cross_encoder", build_cross_encoder, {"task": "rerank"}, {Output.SCORES, Output.LABELS}),
    ("classifier", lambda d: build_cross_encoder(d, labels=["a", "b", "c"]), {}, {Output.LABELS}),
    ("yes_no", lambda d: build_qwen3_reranker(d / "qwen3-reranker"), {"task": "rerank"}, {Output.SCORES}),
]


@pytest.mark.parametrize(("name", "build", "options", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_model_kind_states_what_it_emits(
    tmp_path: Path, name: str, build: Callable[[Path], Path], options: dict[str, str], expected: set[Output]
) -> None:
    engine = Engine.from_pretrained(build(tmp_path / name), **options)
    try:
        assert engine.outputs == frozenset(expected)
        # the heads agree with what it states: each output has the engine's head for it
        assert (engine.sparse_head is not None) == (S in expected)
        assert (engine.lexical_head is not None) == (L in expected)
        head = engine.multivector_head
        assert (head is not None) == (M in expected)
        assert multivectors_only(engine.outputs) == (head is not None and head.only)
        assert (engine.score_head is not None) == bool(expected & {Output.SCORES, Output.LABELS})
        # every output it states answers through the one path; the others are refused by name
        for output in Output:
            ask, inputs = Ask(output), INPUTS.get(output, ["a b c"])
            if output in expected:
                assert len(engine.run(inputs, ask)) == (
                    1 if output is P else len(inputs[-1]) if output is Output.SCORES else len(inputs)
                )
            elif output is not D:  # a reranker's pooled rows still embed (the server refuses by task)
                with pytest.raises(InvalidInputError):
                    engine.run(inputs, ask)
    finally:
        engine.close()
