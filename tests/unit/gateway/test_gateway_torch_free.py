"""The gateway runs without torch (#62): importing its app loads none, and its token counter opens
each model kind (a decoder, a GGUF file, ColBERT, BGE-M3, inference-free SPLADE) and counts as it
does beside torch, in a process where importing torch raises."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer

from embedserve.errors import ModelLoadError
from embedserve.gateway.pools.counting import TokenCounter
from embedserve.models.multivector import load_multivector_head
from embedserve.models.static_queries import StaticQueries
from tests.helpers.real_text import documents
from tests.helpers.tiny_gguf import build_gguf_pair, train_tokenizer
from tests.helpers.tiny_models import build_decoder
from tests.helpers.tiny_multivector import build_colbert
from tests.helpers.tiny_sparse import build_bge_m3, build_inference_free, build_splade

# Any import of torch raises, so a lazy one on the counting path fails the child, naming itself.
# What is counted, in the test's process and in the child's (one text, run by both).
_COUNTS = """
def counts(counter, texts):
    out = {"plain": counter.count(texts, counter.resolve_prompt(None, None))}
    if counter.spec.token_vectors is not None:
        out["query"] = counter.count_multivector(texts, "query", None, None)
        out["document"] = counter.count_multivector(texts, "document", None, None)
    if counter.spec.static is not None:
        out["static"] = counter.count_static(texts, "")
    return out
"""
_CHILD = (
    """
import json, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch imported by the gateway: " + name)
sys.meta_path.insert(0, NoTorch())
from embedserve.gateway.pools.counting import TokenCounter
"""
    + _COUNTS
    + """
print(json.dumps(counts(TokenCounter(sys.argv[1]), json.loads(sys.argv[2]))))
"""
)
_SCOPE: dict[str, Any] = {}
exec(_COUNTS, _SCOPE)


def _counts(counter: TokenCounter, texts: list[str]) -> dict[str, list[int]]:
    return dict(_SCOPE["counts"](counter, texts))


@pytest.mark.parametrize(
    "code",
    [
        "import embedserve.gateway.app",
        # `embedserve gateway` builds the whole command line first: every tool's flags
        "from embedserve.cli import build_parser; build_parser()",
    ],
)
def test_the_gateway_loads_no_torch(code: str) -> None:
    check = f"{code}; import sys; assert 'torch' not in sys.modules, 'torch loaded'"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("torch_free")
    splade = build_splade(root / "splade")
    return {
        "decoder": build_decoder(root / "decoder"),
        "gguf": build_gguf_pair(root / "gguf", "llama", train_tokenizer())[1],
        "colbert": build_colbert(root / "colbert"),
        "bge_m3": build_bge_m3(root / "bge_m3"),
        "inference_free": build_inference_free(root / "free", splade),
    }


@pytest.mark.parametrize("kind", ["decoder", "gguf", "colbert", "bge_m3", "inference_free"])
def test_the_counter_counts_without_torch(models: dict[str, Path], kind: str) -> None:
    texts = [d[:300] for d in documents()[:4]]
    expected = _counts(TokenCounter(models[kind]), texts)
    assert set(expected) >= {"plain"} and all(n > 0 for ns in expected.values() for n in ns)
    if kind in ("colbert", "bge_m3"):
        assert "query" in expected
    if kind == "inference_free":
        assert "static" in expected
    child = [sys.executable, "-c", _CHILD, str(models[kind]), json.dumps(texts)]
    done = subprocess.run(child, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == expected


def _refusal(make: Callable[[], object]) -> str:
    with pytest.raises(ModelLoadError) as e:
        make()
    return str(e.value)


def test_the_counter_refuses_broken_heads_as_the_pools_do(models: dict[str, Path], tmp_path: Path) -> None:
    """What reads without torch is checked at the gateway's start, in the pools' words: a ColBERT
    Dense module's config and weight shape, inference-free SPLADE's query weights."""
    from safetensors.torch import save_file

    colbert = tmp_path / "colbert"
    shutil.copytree(models["colbert"], colbert)
    dense = colbert / "1_Dense"
    config = json.loads((dense / "config.json").read_text())
    (dense / "config.json").write_text(json.dumps({**config, "in_features": 999}))
    said = _refusal(lambda: TokenCounter(colbert))
    assert "Dense in_features 999 != hidden size" in said
    tokenizer = Tokenizer.from_file(str(colbert / "tokenizer.json"))
    assert said == _refusal(lambda: load_multivector_head(colbert, 384, tokenizer))  # the pools' words
    (dense / "config.json").write_text(json.dumps(config))
    save_file({"linear.weight": torch.zeros(3, 384)}, str(dense / "model.safetensors"))
    said = _refusal(lambda: TokenCounter(colbert))
    assert said.endswith(f"expected linear.weight [{config['out_features']}, 384]")

    free = tmp_path / "free"
    shutil.copytree(models["inference_free"], free)
    query = next(p for p in free.iterdir() if p.name.startswith("query_"))
    save_file({"weight": torch.ones(7)}, str(query / "model.safetensors"))
    said = _refusal(lambda: TokenCounter(free))
    assert said.endswith("values (one per vocabulary id), got (7,)")
    assert said == _refusal(lambda: StaticQueries(query, 30522))
