"""The gateway's pools: pools.yaml's reader, placement, schema guards, upstream health and
choice, forwarding, fair share, token counting, metrics."""
