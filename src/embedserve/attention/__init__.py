"""Attention: per-step metadata, the CPU and CUDA routes, and the route chosen once per model."""
