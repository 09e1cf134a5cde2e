"""Tensors: packed step inputs, paged attention and the model runner. Never decides policy."""
