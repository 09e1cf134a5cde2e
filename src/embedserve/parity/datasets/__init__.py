"""Parity datasets: built-in names, `beir:NAME`, or a BEIR-layout folder (`NAME?option=value&...`)."""

from __future__ import annotations

from pathlib import Path

from embedserve.parity.datasets.base import Dataset, DatasetContext, Item, Parts, find_data_dir
from embedserve.parity.datasets.beir import load_beir
from embedserve.parity.datasets.beir_download import PREFIX as BEIR_PREFIX
from embedserve.parity.datasets.beir_download import beir_folder, beir_name
from embedserve.parity.datasets.cranfield import load_cranfield
from embedserve.parity.datasets.images import load_images
from embedserve.parity.datasets.peps import load_peps
from embedserve.parity.datasets.pydocs import load_pydocs
from embedserve.parity.datasets.random_tokens import load_random_tokens
from embedserve.parity.datasets.synthetic import load_synthetic
from embedserve.parity.options import Options, ParityError, split_spec

# pydocs and the synthetic sets exist on every machine; cranfield and peps need --data-dir;
# images (text + image inputs) needs a multimodal model.
BUILTIN = ("pydocs", "passkey", "needle", "random-tokens", "images", "cranfield", "peps")

__all__ = [
    "BUILTIN",
    "Dataset",
    "DatasetContext",
    "Item",
    "Parts",
    "check_dataset",
    "find_data_dir",
    "load_dataset",
]


def check_dataset(spec: str) -> None:
    """Refuse an unknown dataset name before any model is loaded."""
    name, _ = split_spec(spec)
    if name.startswith(BEIR_PREFIX):
        beir_name(name)
        return
    if name not in BUILTIN and not Path(name).expanduser().is_dir():
        raise ParityError(
            f"unknown dataset {name!r}: use one of {', '.join(BUILTIN)}, beir:NAME (e.g. beir:scifact) "
            "or a folder with corpus.jsonl, queries.jsonl and qrels/test.tsv"
        )


def load_dataset(spec: str, ctx: DatasetContext) -> Dataset:
    check_dataset(spec)
    name, raw = split_spec(spec)
    opts = Options(f"dataset {name}", raw)
    if name == "pydocs":
        return load_pydocs(ctx, opts)
    if name == "cranfield":
        return load_cranfield(ctx, opts)
    if name == "peps":
        return load_peps(ctx, opts)
    if name in ("passkey", "needle"):
        return load_synthetic(name, ctx, opts)
    if name == "random-tokens":
        return load_random_tokens(ctx, opts)
    if name == "images":
        return load_images(ctx, opts)
    if name.startswith(BEIR_PREFIX):
        return load_beir(beir_folder(name, ctx.data_dir, ctx.progress), opts)
    return load_beir(Path(name).expanduser(), opts)
