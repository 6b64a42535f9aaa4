"""Errors raised while finding or reading weights: ValueErrors that name the file and problem."""


class ModelLoadError(ValueError):
    """A model path that is missing, truncated, corrupt or of a form ladle cannot read."""
