"""Prompts pinned in the prefix cache (`cache_prompt`): the server pins the model's prompts at
warm-up, so every input embedded with one computes only its own tokens. `PromptCacheMixin`
gives `Engine` the methods."""

from __future__ import annotations

from concurrent.futures import Future

from embedserve.engine.base import EngineBase
from embedserve.engine.core import Finished
from embedserve.engine.loop import gather_all, wait_all


class PromptCacheMixin(EngineBase):
    """Prompts kept in the prefix cache for good."""

    def cache_prompt(self, prompt: str) -> int:
        """Keep `prompt`'s K/V in the prefix cache for good (its full blocks and its tail), so
        every input embedded with it computes only its own tokens; returns the prompt's tokens
        (0: prefix caching is off). The server does it for the model's prompts at warm-up."""
        futures, n = self._pin(prompt)
        wait_all(futures)
        return n

    async def cache_prompt_async(self, prompt: str) -> int:
        futures, n = self._pin(prompt)
        await gather_all(futures)
        return n

    def _pin(self, prompt: str) -> tuple[list[Future[Finished]], int]:
        if not (self.config.cache.prefix_caching and prompt):
            return [], 0
        (req,) = self._requests(self.tokenize(["warm"], prompt), None, None, "online")
        req.pin_prefix = self.tokenizer.count_prompt_tokens(prompt)
        return self._loop.submit([req]), req.pin_prefix
