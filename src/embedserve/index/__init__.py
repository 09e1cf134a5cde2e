"""Indexing into a vector database, schema-safe search and dual-index model upgrades."""
