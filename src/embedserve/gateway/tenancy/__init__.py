"""The gateway's tenants: their configuration, keys, quotas and concurrency caps."""
