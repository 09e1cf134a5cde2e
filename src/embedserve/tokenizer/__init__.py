"""Inputs as a model reads them, torch-free, shared by the engine and the gateway's counter:

core          Tokenizer (special tokens, truncation), Tokenized, Truncate, prompts
pairs         (query, document) and (text, text_pair) pairs as rerankers / classifiers read them
multimodal    Qwen3-VL's chat format: parts -> tokens + images
spans, late   late chunking: a document's chunks as token spans
windows       a long late-chunked document as overlapping windows
spec          RenderSpec: what rendering reads of a model (the engine's parts, or its files)
render        Renderer (render.py + render_sides.py): every input kind, one place
"""

from embedserve.tokenizer.core import Tokenized, Tokenizer, Truncate, resolve_prompt, tokenize_inputs

__all__ = ["Tokenized", "Tokenizer", "Truncate", "resolve_prompt", "tokenize_inputs"]
