"""A Qwen3-VL directory's own chat template renders the prompt (as transformers'
apply_chat_template does); without one, the built-in format of the official embedder."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from embedserve import Engine
from embedserve.errors import ModelLoadError
from tests.helpers.reference import cosine
from tests.helpers.tiny_vl import INSTRUCTION, hf_vl_embed, image, reference_prompt

# Qwen3-VL's layout: role headers, images as vision_start / image_pad / vision_end, texts inline.
QWEN_STYLE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for c in message['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A different one: no system turn, the instruction folded into the user turn.
OTHER = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{% set ns = message['content'][0]['text'] %}Task: {{ ns }}\n"
    "{% else %}User: {% for c in message['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}Embedding:{% endif %}"
)
PARTS = ["before ", image(128, 64, seed=5), " between ", image(64, 96, seed=6), " after"]


def _with_template(src: Path, dst: Path, template: str) -> Path:
    shutil.copytree(src, dst)
    (dst / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    return dst


def test_qwen_style_template_is_the_built_in_format(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    templated = _with_template(qwen3_vl_dir, tmp_path / "qwen_style", QWEN_STYLE)
    with Engine.from_pretrained(qwen3_vl_dir) as a, Engine.from_pretrained(templated) as b:
        assert a.renderer.text([PARTS])[0].token_ids == b.renderer.text([PARTS])[0].token_ids
        assert np.array_equal(a.embed([PARTS]), b.embed([PARTS]))


def test_another_template_matches_transformers_rendering(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    templated = _with_template(qwen3_vl_dir, tmp_path / "other", OTHER)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": INSTRUCTION}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in PARTS
            ],
        },
    ]
    text = AutoTokenizer.from_pretrained(qwen3_vl_dir).apply_chat_template(
        messages, chat_template=OTHER, tokenize=False, add_generation_prompt=True
    )
    assert text != reference_prompt(PARTS) and text.startswith("Task: ")
    ref = hf_vl_embed(qwen3_vl_dir, PARTS, text=text)
    with Engine.from_pretrained(templated, max_num_batched_tokens=48) as engine:
        got = engine.embed([PARTS])
    assert cosine(got, ref[None])[0] >= 0.99999


# Text-only templates as language models ship them: content read as a string.
TEXT_ONLY = {
    "concatenates": (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
        " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}"
    ),
    "prints": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\\n{{ message['content'] }}"
        "<|im_end|>\\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}"
    ),
}


@pytest.mark.slow  # CI time (2026-12-06): its area keeps a representative in CI
@pytest.mark.parametrize("kind", sorted(TEXT_ONLY))
def test_a_text_only_template_is_set_aside_for_the_built_in_format(
    qwen3_vl_dir: Path, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A text-only template in tokenizer_config.json (it fails on a list `content`, or prints
    it and drops the image) would refuse or garble every image input: set aside at load with a
    warning naming the file, and the built-in format serves the same vectors as without it."""
    dst = Path(shutil.copytree(qwen3_vl_dir, tmp_path / kind))
    config = dst / "tokenizer_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"chat_template": TEXT_ONLY[kind]}))
    with caplog.at_level(logging.WARNING, logger="embedserve.vision.template"):
        engine_b = Engine.from_pretrained(dst)
    with Engine.from_pretrained(qwen3_vl_dir) as a, engine_b as b:
        assert np.array_equal(a.embed([PARTS]), b.embed([PARTS]))
    assert str(config) in caplog.text and "built-in Qwen3-VL prompt format" in caplog.text
    assert ("TypeError" if kind == "concatenates" else "0 image placeholders") in caplog.text


def test_a_template_that_does_not_parse_stops_the_load(qwen3_vl_dir: Path, tmp_path: Path) -> None:
    dst = _with_template(qwen3_vl_dir, tmp_path / "broken", "{% for m in messages %}{{ m }")
    with pytest.raises(ModelLoadError, match="chat template does not parse"):
        Engine.from_pretrained(dst).close()
