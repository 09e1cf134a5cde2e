"""A model directory's own chat template, rendered as transformers' `apply_chat_template` does
(sandboxed jinja2, `add_generation_prompt=True`), for the multimodal prompt.

Messages: the instruction as the system message, the input's parts as the user message, each
image as `{"type": "image"}`; the template writes one `<|image_pad|>` per image, which the
prompter then widens to the image's token count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embedserve.errors import InvalidInputError, ModelLoadError


def read_chat_template(root: Path) -> str | None:
    """`chat_template.jinja`, `chat_template.json` or tokenizer_config.json's, in that order."""
    jinja = root / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    for name in ("chat_template.json", "tokenizer_config.json"):
        f = root / name
        if f.exists():
            try:
                template = json.loads(f.read_text(encoding="utf-8")).get("chat_template")
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"cannot read {f}: {e}") from e
            if isinstance(template, str):
                return template
            if template is not None:
                raise ModelLoadError(f"{f}: only a single (string) chat_template is supported")
    return None


class ChatTemplate:
    def __init__(self, source: str) -> None:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
            x, indent=indent, ensure_ascii=ensure_ascii
        )
        env.globals["raise_exception"] = raise_exception
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise ModelLoadError(f"the directory's chat template does not parse: {e}") from e
        self._error = TemplateError

    def render(self, instruction: str, parts: list[dict[str, Any]]) -> str:
        messages = [
            {"role": "system", "content": [{"type": "text", "text": instruction}]},
            {"role": "user", "content": parts},
        ]
        try:
            return self.template.render(messages=messages, add_generation_prompt=True)
        except self._error as e:
            raise InvalidInputError(f"the model's chat template refused the input: {e}") from None
