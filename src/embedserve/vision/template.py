"""A model directory's own chat template, rendered as transformers' `apply_chat_template` does
(sandboxed jinja2, `add_generation_prompt=True`), for the multimodal prompt.

Messages: the instruction as the system message, the input's parts as the user message, each
image as `{"type": "image"}`; the template writes one `<|image_pad|>` per image, which the
prompter then widens to the image's token count.

A directory may carry a text-only template (a language model's, copied into
tokenizer_config.json): one that reads `message.content` as a string fails or drops the image
on every image input. Each template is tried at load on a text and an image part
(`_renders_images`); one that cannot render them is set aside with a warning naming its file,
and the next template file, else the built-in Qwen3-VL format, is used.
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
    """The first of `chat_template.jinja`, `chat_template.json` and tokenizer_config.json's
    template that renders an image (`_renders_images`; one that does not is logged and skipped);
    None where there is none."""
    for f in (root / "chat_template.jinja", root / "chat_template.json", root / "tokenizer_config.json"):
        if not f.exists():
            continue
        if f.suffix == ".jinja":
            template: object = f.read_text(encoding="utf-8")
        else:
            try:
                template = json.loads(f.read_text(encoding="utf-8")).get("chat_template")
            except (OSError, ValueError) as e:
                raise ModelLoadError(f"cannot read {f}: {e}") from e
        if template is None:
            continue
        if not isinstance(template, str):
            raise ModelLoadError(f"{f}: only a single (string) chat_template is supported")
        if _renders_images(template, f):
            return template
    return None


def _renders_images(source: str, f: Path) -> bool:
    """`source` renders an instruction and a user turn of a text and an image part with the text
    kept and one image placeholder; else False, with a warning naming `f` and what went wrong.
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
        problem = None if pads == 1 else f"it wrote {pads} image placeholders for one image"
        if problem is None and probe not in text:
            problem = "it dropped the text part"
    except Exception as e:  # a text-only template: TypeError on a list content, UndefinedError, ...
        problem = f"{type(e).__name__}: {e}"
    if problem is None:
        return True
    log.warning(
        "%s: its chat template cannot render an image part (%s); it looks text-only and is not "
        "used (the built-in Qwen3-VL prompt format, or another template file of the directory, "
        "is). Remove it from %s to silence this, or replace it with a vision-language template.",
        f,
        problem,
        f.name,
    )
    return False


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
