"""Plain architectures and their loading; pooling is attached from outside."""
