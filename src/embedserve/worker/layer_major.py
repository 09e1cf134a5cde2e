"""Layer-major prefill of one long prompt: every chunk through layer 0, then layer 1, ...

Chunk-major prefill (the scheduler's path) keeps every layer's K/V for the whole prompt
until the last chunk: 16K tokens of a Qwen3-Embedding-0.6B-shaped model hold 1.9 GB in
bf16. Walking the layers in the outer loop instead needs, per prompt,

    hidden  [prompt_len, hidden]            the residual stream at the current layer
    kv      [2, kv_heads, prompt_len, d]     the current layer's K/V, overwritten per layer

about 0.1 GB for the same prompt (18x less), and each layer's weights are reused by all
chunks while they are hot in cache. The work is cut into (layer, chunk) units so the engine
can interleave it with its other requests step by step.

    layer 0:  c0 c1 c2 ... ck
    layer 1:  c0 c1 c2 ... ck      chunk c at layer l attends to K/V of chunks 0..c at layer l
    ...                            (written by this layer's earlier units: causal order holds)
    final norm on the pooled rows only -> `pooled_rows()`, folded by the engine as the
                                   chunked path's rows are

The last layer's output is read only at the pooled rows (LAST pooling: one row of the
prompt). Its units store every row's K/V (the pooled rows attend to them) but run attention,
the output projection and the MLP for the pooled rows only (docs/performance.md has its time).

Units never cross a chunk boundary (multiples of `chunk`). Inside a chunk, from a position
on the granule (64 rows) a unit is a size on the granule ladder (1, 2, 3, 4, 6, 8, 12, ...
granules: two significant bits, less than a third under the wish); a unit shorter than a
granule (a query's step left less time) is a power of two that starts on a multiple of
itself, so positions come back to the granule in a few steps (64, 72, 80, 96, 128). oneDNN
builds and keeps a kernel (about 0.55 MB, milliseconds to build) for every matmul shape it
meets, and the allocator keeps holes of every size it served: units cut anywhere (a slice
that ran into the next layer by a few rows, a unit sized to a time) gave every layer new
shapes, and the process grew by gigabytes. Units of any whole number of granules still met
up to 32 shapes a chunk while units followed an online step's time: a bf16 4K prompt in the
responsive window after one short query ran slower than before short queries got faster, and
on the ladder no longer does (docs/performance.md, 'Lane units on a ladder').
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from embedserve.models.decoder import DecoderModel
from embedserve.request import Request
from embedserve.worker.host_memory import release_free_heap

GRANULE = 64  # rows; a power of two (see unit_rows)
# Prompts of at least this many chunks give their freed heap pages back after every layer
# (all prompts do when they end). A trim costs the next layer's first unit its page faults
# again: a visible share of a short prompt's layer, little at 16K, where the holes it returns
# are worth more (docs/performance.md, "Heap").
TRIM_EVERY_LAYER_CHUNKS = 4


def ladder_floor(n: int) -> int:
    """The largest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3 * 2^k) that is <= n (>= 1)."""
    top = 1 << (n.bit_length() - 1)
    three = top + top // 2  # top itself where top is 1
    return three if n >= three else top


class LayerMajorJob:
    def __init__(
        self,
        model: DecoderModel,
        request: Request,
        chunk: int,
        device: torch.device,
        whole_chunks: bool = False,
        deterministic_chunk: int | None = None,
    ) -> None:
        """Deterministic mode: `whole_chunks`, every unit is one whole chunk (never cut to a
        time) and the last layer runs every row; `deterministic_chunk`, attention runs per piece of that many
        positions (`chunk` a multiple of it): each attention call has the shape the chunked
        path gives the same positions."""
        if deterministic_chunk is not None and chunk % deterministic_chunk:
            raise ValueError(f"layer-major chunk {chunk} is not a multiple of {deterministic_chunk}")
        if chunk < 1:
            raise ValueError("layer-major chunk must be >= 1 token")
        cfg = model.config
        self.model = model
        self.request = request
        self.chunk = chunk
        self.whole_chunks = whole_chunks
        self.deterministic_chunk = deterministic_chunk
        self.granule = min(GRANULE, 1 << (chunk.bit_length() - 1))  # a power of two <= chunk
        self.num_layers = cfg.num_hidden_layers
        self.length = request.num_prompt_tokens
        self.device = device
        self.ids = torch.tensor(request.token_ids, dtype=torch.int64, device=device)
        self.hidden: torch.Tensor | None = None  # allocated by the first unit, not while queued
        self.kv: torch.Tensor | None = None
        self._kv_shape = (2, cfg.num_key_value_heads, self.length, cfg.head_dim)  # head-major
        self.layer = 0
        self.pos = 0  # next chunk start at `layer`
        flops = model.layer_flops()
        self.flops_per_row = flops.per_row  # one row through one layer
        self.flops_per_key = flops.per_key  # plus QK^T and PV per visible key
        self.flops_per_stored_row = flops.per_stored_row  # the last layer's rows not pooled
        self.flops_done = 0.0
        self.trim_every_layer = self.length >= TRIM_EVERY_LAYER_CHUNKS * chunk

    @property
    def done(self) -> bool:
        return self.layer == self.num_layers

    @property
    def tokens_left(self) -> int:
        """Token-layers of work remaining (a chunked step of T tokens costs T * num_layers)."""
        return (self.num_layers - self.layer) * self.length - self.pos

    def _kept(self, rows: int) -> slice | None:
        """The rows of the unit [pos, pos+rows) read after the current layer, local to it:
        None (all) before the last layer; the pooled rows at the last."""
        if self.layer < self.num_layers - 1 or self.whole_chunks:
            return None
        return slice(*self.request.pooling.rows(self.pos, rows))

    def unit_flops(self, rows: int) -> float:
        """FLOPs of the next unit if it ran `rows` rows (row i sees pos + i + 1 keys)."""
        rows = min(rows, self.length - self.pos)
        keep = self._kept(rows)
        lo, hi = (0, rows) if keep is None else (keep.start, keep.stop)
        stored = (rows - (hi - lo)) * self.flops_per_stored_row
        return stored + (hi - lo) * (self.flops_per_row + self.flops_per_key * (self.pos + (lo + hi + 1) / 2))

    def _chunk_left(self) -> int:
        """Rows from `pos` to the next chunk boundary (or the prompt's end)."""
        return min(self.length, (self.pos // self.chunk + 1) * self.chunk) - self.pos

    def unit_rows(self, want: int) -> int:
        """Rows of the next unit for a wish of `want` (>= 1): up to the chunk boundary if the
        wish reaches it; else the largest size on the granule ladder <= `want` from a position
        on the granule; else the largest power of two <= `want` that `pos` is a multiple of."""
        left = self._chunk_left()
        if want >= left or self.whole_chunks:
            return left
        g = self.granule
        if want >= g and self.pos % g == 0:
            return g * ladder_floor(want // g)
        aligned = g if self.pos % g == 0 else self.pos & -self.pos
        return min(aligned, 1 << (want.bit_length() - 1))

    def rows_within(self, flops: float) -> int:
        """The largest `unit_rows` (at least one row, at most to the chunk boundary) whose
        unit costs <= `flops`."""
        lo, hi = 1, self._chunk_left()  # over wishes: unit_rows and unit_flops both grow
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.unit_flops(self.unit_rows(mid)) <= flops else (lo, mid - 1)
        return self.unit_rows(lo)

    @torch.inference_mode()
    def run(self, token_layers: int) -> int:
        """Run (layer, chunk) units worth about `token_layers` (or what is left); returns those
        run. The first unit is `unit_rows` of the slice; after it the slice runs only whole
        units to the next chunk boundary, so whole-chunk slices stay on chunk boundaries."""
        spent = 0
        while spent < token_layers and not self.done:
            want = token_layers - spent
            if spent and want < self._chunk_left():
                break
            if self.hidden is None:
                self.hidden = self.model.embed(self.ids)
                self.kv = self.hidden.new_empty(self._kv_shape)
            assert self.kv is not None
            end = self.pos + self.unit_rows(want)
            assert 0 < end - self.pos <= self._chunk_left()
            rows = slice(self.pos, end)
            self.flops_done += self.unit_flops(end - self.pos)
            positions = torch.arange(self.pos, end, device=self.device)
            # updates the rows of `hidden` it keeps, in place
            keep = self._kept(end - self.pos)
            self.model.run_layer(
                self.layer, self.hidden[rows], positions, self.kv, self.pos, keep, self.deterministic_chunk
            )
            spent += end - self.pos
            self.pos = end
            if self.pos == self.length:
                self.layer, self.pos = self.layer + 1, 0
                if self.trim_every_layer:
                    release_free_heap()  # this layer's freed activations, before the next one's
        if self.done:
            self.kv = None  # nothing reads it any more
        return spent

    @torch.inference_mode()
    def pooled_rows(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(start, n, rows) per chunk of the prompt: the final hidden states (float32, CPU) of
        the rows pooling reads, for the caller to fold in order. Frees the hidden states."""
        assert self.done and self.hidden is not None, "pooled_rows() before the last layer ran"
        hidden, self.hidden = self.hidden, None
        state = self.request.pooling
        for start in range(0, self.length, self.chunk):
            n = min(self.chunk, self.length - start)
            lo, hi = state.rows(start, n)
            yield start, n, self.model.final_norm(hidden[start + lo : start + hi]).float().cpu()
