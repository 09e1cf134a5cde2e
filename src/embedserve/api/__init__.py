"""The embeddings API shared by the server and the gateway: wire format and HTTP plumbing."""
