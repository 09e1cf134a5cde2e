"""`POST /tokenize`, `POST /detokenize` and TEI's `POST /decode` on the serving template:
answered from the tokenizer alone (no admission, no engine work). The token ids come from the
engine's own tokenization, the one `/v1/embeddings` bills by, so `count` is that route's
`usage.prompt_tokens`; offsets and the special-token mask come from the same encoding of the
text (api/tokenize.py)."""

from __future__ import annotations

import sys
from typing import Any

from embedserve.api.multimodal import resolve_items
from embedserve.api.protocol import ApiError
from embedserve.api.routes import DECODE, DETOKENIZE, TOKENIZE
from embedserve.api.tei_similarity import DecodeRequest
from embedserve.api.tokenize import DetokenizeRequest, TokenizeRequest, Tokens, tokenize_body
from embedserve.server.pipeline import Computed, Job, ServerRoute
from embedserve.server.serving import EmbeddingService
from embedserve.tokenizer import Tokenized, Truncate

_UNCUT = sys.maxsize  # no `truncate`: the whole input is counted


class TokenizeJob(Job):
    computes = False

    def __init__(self, svc: EmbeddingService, req: TokenizeRequest) -> None:
        super().__init__(req.model, len(req.items))
        self.svc = svc
        self.req = req
        self.tokens: list[Tokens] = []

    def tokenize(self) -> list[Tokenized]:
        req, engine = self.req, self.svc.engine
        prompt = engine.renderer.prompt(req.prompt_name, None)
        items = req.items
        limit = _UNCUT if req.truncate is None else engine.config.scheduler.max_model_len
        policy = req.truncate or "error"
        texts_only = all(isinstance(x, str) for x in items)
        if not req.add_special_tokens and (engine.multimodal or not texts_only):
            raise ApiError(400, "add_special_tokens=false is taken for texts on a text-only model")
        tokenized = engine.renderer.text(resolve_items(list(items)), prompt, policy, max_len=limit)
        want_spans = req.tei or req.return_offsets or not req.add_special_tokens
        for item, tok in zip(items, tokenized, strict=True):
            if not want_spans or not isinstance(item, str) or engine.multimodal:
                self.tokens.append(Tokens(tok.token_ids, None, None, ""))  # images: no text spans
                continue
            enc, _ = engine.tokenizer.encoding(
                item, limit, Truncate.parse(policy), prompt, req.add_special_tokens
            )
            self.tokens.append(
                Tokens(
                    list(enc.ids), list(enc.offsets), [m == 1 for m in enc.special_tokens_mask], prompt + item
                )
            )
        return tokenized if req.add_special_tokens else [Tokenized(t.ids, False) for t in self.tokens]

    def body(self, done: Computed) -> Any:
        return tokenize_body(self.req, self.tokens, self.svc.engine.config.scheduler.max_model_len)


class DetokenizeJob(Job):
    computes = False

    def __init__(self, svc: EmbeddingService, req: DetokenizeRequest) -> None:
        super().__init__(req.model, 1)
        self.svc = svc
        self.req = req

    def tokenize(self) -> list[Tokenized]:
        # Ids outside the vocabulary are refused naming the first one.
        return [self.svc.engine.tokenizer.check_ids(self.req.tokens, _UNCUT, Truncate.ERROR)]

    def body(self, done: Computed) -> dict[str, Any]:
        ids = done.tokenized[0].token_ids
        return {"prompt": self.svc.engine.tokenizer.backend.decode(ids, skip_special_tokens=False)}


class DecodeJob(Job):
    computes = False

    def __init__(self, svc: EmbeddingService, req: DecodeRequest) -> None:
        super().__init__(req.model, len(req.batch))
        self.svc = svc
        self.req = req

    def tokenize(self) -> list[Tokenized]:
        check = self.svc.engine.tokenizer.check_ids
        return [check(ids, _UNCUT, Truncate.ERROR) for ids in self.req.batch]

    def body(self, done: Computed) -> list[str]:
        decode = self.svc.engine.tokenizer.backend.decode
        skip = self.req.skip_special_tokens
        return [decode(t.token_ids, skip_special_tokens=skip) for t in done.tokenized]


TOKENIZE_ROUTE = ServerRoute(TOKENIZE, TokenizeJob)
DECODE_ROUTE = ServerRoute(DECODE, DecodeJob)
DETOKENIZE_ROUTE = ServerRoute(DETOKENIZE, DetokenizeJob)
