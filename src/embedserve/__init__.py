"""embedserve: long-context embedding serving with chunked prefill and proven parity."""

from embedserve.engine.engine import EmbeddingOutput, Engine

__all__ = ["EmbeddingOutput", "Engine"]
__version__ = "0.1.0"
