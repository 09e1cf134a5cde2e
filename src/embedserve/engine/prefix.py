"""Prompts pinned in the prefix cache (`cache_prompt`): the server pins the model's prompts at
warm-up, so every input embedded with one computes only its own tokens. `PromptCacheMixin`
gives `Engine` the method."""

from __future__ import annotations

from embedserve.engine.base import EngineBase
from embedserve.engine.loop import wait_all


class PromptCacheMixin(EngineBase):
    """Prompts kept in the prefix cache for good."""

    def cache_prompt(self, prompt: str) -> int:
        """Keep `prompt`'s K/V in the prefix cache for good (its full blocks and its tail), so
        every input embedded with it computes only its own tokens; returns the prompt's tokens
        (0: prefix caching is off). Blocks until the prompt ran; the server does it for the
        model's prompts at warm-up (in a thread)."""
        if not (self.config.cache.prefix_caching and prompt):
            return 0
        (req,) = self._requests(self.renderer.text(["warm"], prompt), None, None, "online")
        req.pin_prefix = self.tokenizer.count_prompt_tokens(prompt)
        wait_all(self._loop.submit([req]))
        return req.pin_prefix
