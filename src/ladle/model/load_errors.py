"""Errors raised while finding or reading weights: ValueErrors that name the file and problem.

Outside the loader package (whose __init__ imports torch and the model code) so that `ladle
serve`'s API process, which loads only the tokenizer, can catch and raise them without torch.
"""


class ModelLoadError(ValueError):
    """A model path that is missing, truncated, corrupt or of a form ladle cannot read."""
