"""HTTP server: OpenAI-compatible embeddings API with readiness, backpressure, metrics and vector metadata."""
