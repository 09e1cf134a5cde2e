"""Plain architectures and their loading; pooling is attached from outside."""

from embedserve.models.default import default_model_path

__all__ = ["default_model_path"]
