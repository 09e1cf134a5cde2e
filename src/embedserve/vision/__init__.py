"""Images inside prompts: decoding and preprocessing (PIL + numpy), M-RoPE positions, the
per-request multimodal state the scheduler and runner share."""
