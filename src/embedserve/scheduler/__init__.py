"""Policy: which tokens of which requests run in the next step. Never builds a tensor."""
