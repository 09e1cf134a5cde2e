"""Qwen3-VL (Qwen3-VL-Embedding): vision tower, M-RoPE text decoder with DeepStack, loading."""
