"""The loader's errors (defined in ladle/model/load_errors.py, which says why they live there)."""

from ladle.model.load_errors import ModelLoadError

__all__ = ["ModelLoadError"]
