"""vLLM's --speculative-config spellings that ladle's SpeculativeConfig fields do not name,
turned into ladle's before the keys are checked.

vLLM's own documentation writes configs ladle would otherwise refuse: the draft-model example
leaves `method` out (vLLM infers it from `model`), its EAGLE examples set
`draft_tensor_parallel_size`, and older configs name n-gram drafting as `model: "[ngram]"`.
No torch here: the API process builds the config too.
"""

from __future__ import annotations

import json
from pathlib import Path

# vLLM v0's spelling of model-free n-gram drafting, still read by vLLM.
NGRAM_MODEL_NAMES = ("[ngram]", "ngram")
# vLLM's key -> ladle's field of the same meaning.
RENAMED_KEYS = {"suffix_decoding_max_cached_requests": "suffix_max_cached_requests"}


def infer_speculative_method(model: str) -> str:
    """vLLM's rule for a config without `method`: EAGLE-3 or EAGLE-1 when the draft is such a
    head (its config.json's architectures for a local folder, else the name, as vLLM matches
    "eagle3" / "eagle-" in it), otherwise a draft model."""
    architectures = _local_architectures(model)
    names = [name.lower() for name in architectures] or [Path(model).name.lower()]
    if any("eagle3" in name for name in names):
        return "eagle3"
    if any("eagle" in name for name in names):
        return "eagle"
    return "draft_model"


def _local_architectures(model: str) -> list[str]:
    config_path = Path(model).expanduser() / "config.json"
    if not config_path.is_file():
        return []
    try:
        architectures = json.loads(config_path.read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [name for name in architectures if isinstance(name, str)]


def from_vllm_spellings(options: dict) -> dict:
    """The user's dict with vLLM's spellings turned into ladle's (a new dict; unknown keys are
    left for SpeculativeConfig to name).

    - no `method`, `model` "[ngram]" / "ngram": method ngram, no model;
    - no `method`, another `model`: method inferred as vLLM does (infer_speculative_method);
    - `draft_tensor_parallel_size`: 1 (or null) is what ladle does (a draft network runs on one
      device) and is dropped; any other value is refused naming the key;
    - `suffix_decoding_max_cached_requests`: ladle's suffix_max_cached_requests.
    """
    options = dict(options)
    for vllm_key, ladle_key in RENAMED_KEYS.items():
        if vllm_key in options:
            if ladle_key in options:
                raise ValueError(
                    f"speculative_config: {vllm_key} and {ladle_key} are the same setting; "
                    "give one"
                )
            options[ladle_key] = options.pop(vllm_key)
    if "draft_tensor_parallel_size" in options:
        draft_tp = options.pop("draft_tensor_parallel_size")
        if draft_tp is not None and (isinstance(draft_tp, bool) or draft_tp != 1):
            raise ValueError(
                "speculative_config.draft_tensor_parallel_size: ladle runs a draft network on "
                f"one device, so only 1 is accepted, got {draft_tp!r}"
            )
    model = options.get("model")
    if options.get("method") is None and isinstance(model, str) and model.strip():
        if model.strip().lower() in NGRAM_MODEL_NAMES:
            options.pop("model")
            options["method"] = "ngram"
        else:
            options["method"] = infer_speculative_method(model)
    return options
