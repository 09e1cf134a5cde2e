"""(query, document) pairs -> token ids, the way each kind of reranker was trained to read them.

Cross-encoders (BERT / RoBERTa / XLM-R): the tokenizer's own pair template, e.g. BERT's

    [CLS] query [SEP] document [SEP]        token types 0 ... 0 1 ... 1

Only the document is ever cut (CrossEncoder's "longest_first" cuts the longer side, which is
the document whenever the query is shorter; we never cut the query).

Qwen3-Reranker (a causal LM): its documented chat template around one instruction line; the
score is read from the last token's logits of "yes" and "no" (models/score_head.py):

    <|im_start|>system\\nJudge whether ... "yes" or "no".<|im_end|>\\n<|im_start|>user\\n
    <Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {document}
    <|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n
"""

from __future__ import annotations

from embedserve.errors import InputTooLongError, InvalidInputError
from embedserve.tokenizer import Tokenized, Tokenizer, Truncate

QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def _check_text(text: object, what: str) -> str:
    if not isinstance(text, str):
        raise InvalidInputError(f"{what} must be a string, got {type(text).__name__}")
    if text == "":  # as the tokenizer refuses it (`/openapi.json`: minLength 1); spaces are a text
        raise InvalidInputError(f"{what} is empty")
    return text


def encode_cross_pair(
    tok: Tokenizer, query: str, document: str, max_len: int, truncate: Truncate, use_types: bool
) -> Tokenized:
    """The tokenizer's pair template; token types only when the model has a segment table."""
    hf = tok.backend
    q = hf.encode(_check_text(query, "query"), add_special_tokens=False)
    d = hf.encode(_check_text(document, "document"), add_special_tokens=False)
    specials = hf.num_special_tokens_to_add(is_pair=True)
    room = max_len - specials - len(q.ids)
    if room < 1:
        raise InvalidInputError(f"the query takes {len(q.ids)} tokens: no room for a document in {max_len}")
    truncated = len(d.ids) > room
    if truncated:
        if truncate is Truncate.ERROR:
            raise InputTooLongError(len(q.ids) + len(d.ids) + specials, max_len)
        d.truncate(room, direction="right" if truncate is Truncate.END else "left")
    enc = hf.post_process(q, d)
    return Tokenized(
        token_ids=list(enc.ids),
        truncated=truncated,
        token_type_ids=list(enc.type_ids) if use_types else None,
    )


def encode_qwen3_pair(
    tok: Tokenizer, query: str, document: str, max_len: int, truncate: Truncate, instruction: str | None
) -> Tokenized:
    """Qwen3-Reranker's template; a long document stays whole (chunked like any decoder
    input) up to `max_len`, past which only the document is cut."""
    hf = tok.backend
    head = f"<Instruct>: {instruction or QWEN3_INSTRUCTION}\n<Query>: {_check_text(query, 'query')}\n"
    head += "<Document>: "
    # Prefix, content and suffix are encoded apart, as the model card's code does; the content
    # in one piece (a BPE merge may cross from "<Document>: " into the document).
    lead = hf.encode(QWEN3_PREFIX, add_special_tokens=False).ids
    content = hf.encode(head + _check_text(document, "document"), add_special_tokens=False)
    tail = hf.encode(QWEN3_SUFFIX, add_special_tokens=False).ids
    ids = list(content.ids)
    n_head = sum(1 for start, _ in content.offsets if start < len(head))
    room = max_len - len(lead) - len(tail) - n_head
    if room < 1:
        raise InvalidInputError(
            f"the query takes {len(lead) + len(tail) + n_head} tokens: no room for a document"
        )
    truncated = len(ids) - n_head > room
    if truncated:
        if truncate is Truncate.ERROR:
            raise InputTooLongError(len(lead) + len(ids) + len(tail), max_len)
        ids = ids[: n_head + room] if truncate is Truncate.END else ids[:n_head] + ids[len(ids) - room :]
    return Tokenized(token_ids=lead + ids + tail, truncated=truncated)


def encode_rerank_pair(
    tokenizer: Tokenizer,
    kind: str,
    query: str,
    document: str,
    limit: int,
    policy: Truncate,
    instruction: str | None,
    token_types: bool,
) -> Tokenized:
    """One (query, document) pair as a reranker of `kind` reads it: Qwen3-Reranker's chat
    template for "yes_no" (models/registry.py YES_NO), else the cross-encoder's pair template.
    The engine's renderer and the gateway's counter both read pairs through this."""
    if kind == "yes_no":
        return encode_qwen3_pair(tokenizer, query, document, limit, policy, instruction)
    return encode_cross_pair(tokenizer, query, document, limit, policy, token_types)


def encode_classify_item(
    tokenizer: Tokenizer, item: object, limit: int, policy: Truncate, token_types: bool
) -> Tokenized:
    """One classifier input: a text, a (text, text_pair) pair (the pair template; only the
    second text is cut) or a token-id list (specials included). Shared as above."""
    if isinstance(item, str):
        return tokenizer.encode(item, limit, policy)
    if isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item):
        return encode_cross_pair(tokenizer, item[0], item[1], limit, policy, token_types)
    if isinstance(item, (list, tuple)):
        return tokenizer.check_ids(list(item), limit, policy)
    raise InvalidInputError(
        f"expected a string, a (text, text_pair) pair or a list of token ids, got {type(item).__name__}"
    )
