"""Paged KV cache bookkeeping: a pool of fixed-size blocks and per-request block tables."""
