"""CUDA attention routes, run on CPU: same vectors as `paged_attention`, padding honoured (by all)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from embedserve.attention.cpu import paged_attention
from embedserve.attention.cuda import VarlenAttention, lower_right_attention, plan_varlen
from embedserve.attention.metadata import AttentionFn, AttentionMetadata, SeqSpan, real_rows
from embedserve.attention.select import (
    SELF_CHECK_TOLERANCE,
    Route,
    choose_route,
    select_attention,
    self_check,
)
from embedserve.scheduler.output import ScheduledChunk, SchedulerOutput
from embedserve.worker.buckets import pad_step_inputs
from embedserve.worker.input_batch import StepInputs, build_step_inputs
from tests.helpers.varlen_reference import reference_varlen

BS = 16
HEADS, KV_HEADS, D = 4, 2, 16

# A first chunk, a continuation after 40 cached tokens, a one-token tail after 20, another first.
CHUNKS = [
    ScheduledChunk(0, 0, [0] * 23, [0, 1], (22, 23)),
    ScheduledChunk(1, 40, [0] * 17, [6, 2, 9, 4], (16, 17)),
    ScheduledChunk(2, 20, [0] * 1, [3, 5], (0, 1)),
    ScheduledChunk(3, 0, [0] * 9, [7], (8, 9)),
]


def _step(chunks: list[ScheduledChunk] = CHUNKS) -> StepInputs:
    return build_step_inputs(SchedulerOutput(step=0, chunks=chunks), BS, torch.device("cpu"))


def _tensors(t: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(t, HEADS, D, generator=gen)
    k = torch.randn(t, KV_HEADS, D, generator=gen)
    v = torch.randn(t, KV_HEADS, D, generator=gen)
    cache = torch.randn(2, 10 * BS, KV_HEADS, D, generator=gen)
    return q, k, v, cache


def _run(fn: AttentionFn, inputs: StepInputs, pad_to: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    n = inputs.input_ids.numel()
    q, k, v, cache = _tensors(n)
    step = inputs
    if pad_to:  # padding rows hold junk (as the model computes them): it must go nowhere
        junk = _tensors(pad_to - n, seed=1)
        q, k, v = torch.cat([q, junk[0]]), torch.cat([k, junk[1]]), torch.cat([v, junk[2]])
        step = pad_step_inputs(inputs, pad_to)
    return fn(q, k, v, cache, step.meta, D**-0.5), cache


ROUTES: dict[str, AttentionFn] = {
    "lower-right": lower_right_attention,
    "varlen": VarlenAttention(reference_varlen),
}
PADDED_ROUTES = {**ROUTES, "cpu": paged_attention}  # every route honours bucket padding


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_route_matches_paged_attention(route: str) -> None:
    inputs = _step()
    want, want_cache = _run(paged_attention, inputs)
    got, got_cache = _run(ROUTES[route], inputs)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_cache, want_cache)


@pytest.mark.parametrize("route", sorted(PADDED_ROUTES))
def test_padding_rows_stay_out_of_cache_and_output(route: str) -> None:
    inputs = _step()
    n = inputs.input_ids.numel()
    want, want_cache = _run(paged_attention, inputs)
    got, got_cache = _run(PADDED_ROUTES[route], inputs, pad_to=n + 13)
    assert got.shape[0] == n + 13
    torch.testing.assert_close(got[:n], want, atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(got[n:]) == 0
    torch.testing.assert_close(got_cache, want_cache)  # no slot written by a padding row


def test_plan_varlen_layout() -> None:
    inputs = _step()
    plan = plan_varlen(inputs.meta)
    assert plan.num_rows == 23 + 17 + 1 + 9 == real_rows(inputs.meta)
    assert plan.cu_q.tolist() == [0, 23, 40, 41, 50]
    assert plan.cu_k.tolist() == [0, 23, 23 + 57, 23 + 57 + 21, 23 + 57 + 21 + 9]
    assert (plan.max_q, plan.max_k) == (23, 57)
    assert plan.cu_q.dtype == plan.cu_k.dtype == torch.int32
    # Sequence 1's keys: its whole prompt 0..56 in block order 6, 2, 9, 4.
    keys_1 = plan.kv_index[23:80].tolist()
    assert keys_1[:BS] == list(range(6 * BS, 7 * BS)) and keys_1[BS : 2 * BS] == list(range(2 * BS, 3 * BS))
    assert keys_1[-1] == 4 * BS + 56 - 3 * BS
    # A first chunk's keys are its own new slots.
    assert plan.kv_index[:23].tolist() == inputs.meta.slot_mapping[:23].tolist()  # type: ignore[index]


def test_plan_varlen_refuses_unpacked_layouts() -> None:
    meta = _step().meta
    swapped = replace(meta, seqs=[meta.seqs[1], meta.seqs[0], *meta.seqs[2:]])
    with pytest.raises(ValueError, match="back to back"):
        plan_varlen(swapped)
    with pytest.raises(ValueError, match="slot mapping"):
        plan_varlen(replace(meta, slot_mapping=None))


def test_varlen_plan_is_built_once_per_step() -> None:
    route = VarlenAttention(reference_varlen)
    a, b = _step().meta, _step().meta
    first = route.plan_for(a)
    assert route.plan_for(a) is first  # every layer of the step reuses it
    assert route.plan_for(b) is not first  # the next step's metadata gets its own


def test_varlen_without_cache_is_bidirectional_like_paged_attention() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(12, HEADS, D, generator=gen)
    k, v = torch.randn(12, KV_HEADS, D, generator=gen), torch.randn(12, KV_HEADS, D, generator=gen)
    meta = AttentionMetadata(
        seqs=[SeqSpan(0, 5, 0, None), SeqSpan(5, 7, 0, None)], slot_mapping=None, causal=False
    )
    want = paged_attention(q, k, v, None, meta, 0.25)
    torch.testing.assert_close(VarlenAttention(reference_varlen)(q, k, v, None, meta, 0.25), want)


def test_choose_route_policy() -> None:
    bf16, fp32 = torch.bfloat16, torch.float32
    assert choose_route("cpu", bf16, None, varlen_ok=True) is Route.CPU
    assert choose_route("cuda", bf16, (9, 0), varlen_ok=True) is Route.FLASH_VARLEN
    assert choose_route("cuda", torch.float16, (8, 0), varlen_ok=True) is Route.FLASH_VARLEN
    assert choose_route("cuda", fp32, (9, 0), varlen_ok=True) is Route.SDPA_LOWER_RIGHT
    assert choose_route("cuda", bf16, (7, 5), varlen_ok=True) is Route.SDPA_LOWER_RIGHT
    assert choose_route("cuda", bf16, (9, 0), varlen_ok=False) is Route.SDPA_LOWER_RIGHT


def test_cpu_keeps_the_cpu_route() -> None:
    selected = select_attention(torch.device("cpu"), torch.float32)
    assert selected.name == Route.CPU.value and selected.fn is paged_attention


def test_self_check_tells_a_right_route_from_a_wrong_one() -> None:
    cpu = torch.device("cpu")
    assert self_check(lower_right_attention, cpu, torch.float32) < 1e-5
    assert self_check(VarlenAttention(reference_varlen), cpu, torch.float32) < 1e-5
    assert self_check(VarlenAttention(reference_varlen), cpu, torch.bfloat16) < SELF_CHECK_TOLERANCE

    def no_context(q, k, v, cache, meta, scale):  # type: ignore[no-untyped-def]
        # A classic chunking bug: the continuation never reads its cached context.
        alone = [replace(s, start=0, kv_slots=None) for s in meta.seqs]
        return paged_attention(q, k, v, cache, replace(meta, seqs=alone), scale)

    assert self_check(no_context, cpu, torch.float32) > 0.5

    def scale_off(q, k, v, cache, meta, scale):  # type: ignore[no-untyped-def]
        return lower_right_attention(q, k, v, cache, meta, scale * 1.05)  # a subtle 5% slip

    assert self_check(scale_off, cpu, torch.bfloat16) > 2 * SELF_CHECK_TOLERANCE
