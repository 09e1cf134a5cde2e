"""A model directory's own chat template, rendered as transformers' `apply_chat_template` does
(sandboxed jinja2, `add_generation_prompt=True`), for the multimodal prompt.

Messages: the instruction as the system message, the input's parts as the user message, each
image as `{"type": "image"}`; the template writes one `<|image_pad|>` per image, which the
prompter then widens to the image's token count.

A directory may carry a text-only template (a language model's, copied into
tokenizer_config.json): one that reads `message.content` as a string fails or drops the image
on every image input. Each template is tried at load on a text and an image part
(`_renders_images`); one that cannot render them is set aside with a warning naming its file,
and the built-in Qwen3-VL format is used.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from embedserve.errors import InvalidInputError, ModelLoadError

log = logging.getLogger(__name__)
_IMAGE_PAD = "<|image_pad|>"  # vision/prompt.py's IMAGE_PAD (it imports this module)


def read_chat_template(root: Path) -> str | None:
    """`chat_template.jinja`, `chat_template.json` or tokenizer_config.json's, in that order;
    None where there is none, or where the first found cannot render an image (logged)."""
    jinja = root / "chat_template.jinja"
    if jinja.exists():
        return _renders_images(jinja.read_text(encoding="utf-8"), jinja)
    for name in ("chat_template.json", "tokenizer_config.json"):
        f = root / name
        if f.exists():
            try:
                template = json.loads(f.read_text(encoding="utf-8")).get("chat_template")
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"cannot read {f}: {e}") from e
            if isinstance(template, str):
                return _renders_images(template, f)
            if template is not None:
                raise ModelLoadError(f"{f}: only a single (string) chat_template is supported")
    return None


def _renders_images(source: str, f: Path) -> str | None:
    """`source` where it renders an instruction and a user turn of a text and an image part with
    the text kept and one image placeholder; else None, with a warning naming `f` and the fix.
    A template that does not parse still stops the load (ChatTemplate: ModelLoadError)."""
    template = ChatTemplate(source)
    probe = "embedserve probe text"
    try:
        text = template.template.render(
            messages=[
                {"role": "system", "content": [{"type": "text", "text": "instruction"}]},
                {"role": "user", "content": [{"type": "text", "text": probe}, {"type": "image"}]},
            ],
            add_generation_prompt=True,
        )
        pads = text.count(_IMAGE_PAD)
        problem = None if pads == 1 and probe in text else f"it wrote {pads} image placeholders for one image"
    except Exception as e:  # a text-only template: TypeError on a list content, UndefinedError, ...
        problem = f"{type(e).__name__}: {e}"
    if problem is None:
        return source
    log.warning(
        "%s: its chat template cannot render an image part (%s); it looks text-only, so the "
        "built-in Qwen3-VL prompt format is used. Remove the template from %s to silence this, "
        "or give the directory a vision-language one (chat_template.jinja).",
        f,
        problem,
        f.name,
    )
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
        except (self._error, TypeError, ValueError) as e:  # raise_exception, or a value it cannot take
            raise InvalidInputError(f"the model's chat template refused the input: {e}") from None
