"""embedserve: long-context embedding serving with chunked prefill and proven parity.

`Engine` is imported lazily: tools that never run a model (the gateway, HTTP clients of the
parity and bench tools) start without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embedserve.engine.engine import EmbeddingOutput, Engine

__all__ = ["EmbeddingOutput", "Engine"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in __all__:
        from embedserve.engine import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'embedserve' has no attribute {name!r}")
