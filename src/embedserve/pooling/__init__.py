"""Pooling lives outside the models: per-request state, methods and the output head."""
