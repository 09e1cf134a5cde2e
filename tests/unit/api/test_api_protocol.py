"""Request parsing and vector encoding of the embeddings API (no server)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from embedserve.api.protocol import ApiError, encode_vector, parse_request


def _parse(body: object) -> list[str] | list[list[int]]:
    return parse_request(json.dumps(body).encode()).items


def test_the_four_openai_input_shapes_normalize_to_a_list_of_items() -> None:
    assert _parse({"input": "hi"}) == ["hi"]
    assert _parse({"input": ["a", "b"]}) == ["a", "b"]
    assert _parse({"input": [1, 2, 3]}) == [[1, 2, 3]]  # one tokenized input
    assert _parse({"input": [[1, 2], [3]]}) == [[1, 2], [3]]


def test_empty_inputs_pass_parsing_so_the_engine_can_name_them() -> None:
    assert _parse({"input": []}) == []
    assert _parse({"input": ""}) == [""]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"input": 3}, "got int"),
        ({"input": [True, 1]}, "not a mix of bool, int"),
        ({"input": [[1, 2.5]]}, "input[0] must be a list of integer token ids; found 2.5"),
        ({"input": [[1], "a"]}, "not a mix of list, str"),
        ({"input": "a", "dimensions": "8"}, "dimensions"),
        ({"input": "a", "normalize": "yes"}, "normalize"),
        ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "a", "extra": 1}, "extra: Extra inputs are not permitted"),
        ({}, "input: Field required"),
    ],
)
def test_wrong_shapes_and_types_are_422_with_the_field_named(body: object, words: str) -> None:
    with pytest.raises(ApiError) as e:
        _parse(body)
    assert e.value.status == 422
    assert words in e.value.message


def test_invalid_json_is_400() -> None:
    with pytest.raises(ApiError) as e:
        parse_request(b'{"input": ')
    assert e.value.status == 400 and "not valid JSON" in e.value.message
    assert e.value.body()["error"]["type"] == "invalid_request_error"


def test_base64_is_little_endian_float32_and_float_is_exact() -> None:
    v = np.array([0.1, -2.5, 3.0e-8, 1.0], dtype=np.float32)
    raw = base64.b64decode(encode_vector(v, "base64"))  # type: ignore[arg-type]
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), v)
    floats = encode_vector(v, "float")
    assert np.array_equal(np.array(json.loads(json.dumps(floats)), dtype=np.float32), v)
