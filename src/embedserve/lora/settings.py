"""What an engine serves of LoRA, resolved from its options (engine/options.py: --enable-lora,
--lora-modules NAME=DIR ..., --max-loras, --max-lora-rank, --merge-lora). No torch here."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# An adapter's name is what a request's `model` field carries: printable, no spaces.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


@dataclass(frozen=True)
class LoraSettings:
    max_loras: int  # adapters loaded at once
    max_rank: int  # the largest rank an adapter may have
    modules: tuple[tuple[str, str], ...]  # (name, directory) loaded at start
    # The one adapter of `modules` merged into the weights at load: the engine then serves it
    # alone, at the base model's speed (no base vectors, no adapters loaded later).
    merge: bool = False


def check_name(name: str) -> str:
    """An adapter's name, or ValueError saying what a name may be."""
    if not _NAME.match(name):
        raise ValueError(
            f"adapter name {name[:80]!r} is not valid: 1-128 letters, digits and . _ : / @ + -, "
            "starting with a letter or digit"
        )
    return name


def parse_modules(specs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """NAME=DIR specs (vLLM's --lora-modules spelling) -> (name, directory) pairs; ValueError
    naming a malformed or repeated one."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"--lora-modules takes NAME=DIR, got {spec!r}")
        check_name(name.strip())
        if any(name.strip() == n for n, _ in out):
            raise ValueError(f"--lora-modules names adapter {name.strip()!r} twice")
        out.append((name.strip(), path.strip()))
    return tuple(out)
