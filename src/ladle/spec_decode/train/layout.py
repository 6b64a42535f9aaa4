"""The EAGLE-3 head checkpoint folder, in the layout vLLM and SGLang load
(`--speculative-config '{"method": "eagle3", "model": OUT}'`):

    OUT/config.json         LlamaForCausalLMEagle3 (Eagle3HeadConfig.to_hf_dict)
    OUT/model.safetensors   fc.weight                          [hidden, 3 * target_hidden]
                            midlayer.self_attn.q_proj.weight   [heads * head_dim, 2 * hidden]
                            midlayer.self_attn.k_proj.weight   [kv_heads * head_dim, 2 * hidden]
                            midlayer.self_attn.v_proj.weight   [kv_heads * head_dim, 2 * hidden]
                            midlayer.self_attn.o_proj.weight   [hidden, heads * head_dim]
                            midlayer.mlp.gate_proj.weight      [intermediate, hidden]
                            midlayer.mlp.up_proj.weight        [intermediate, hidden]
                            midlayer.mlp.down_proj.weight      [hidden, intermediate]
                            midlayer.input_layernorm.weight    [hidden]
                            midlayer.hidden_norm.weight        [hidden]
                            midlayer.post_attention_layernorm.weight  [hidden]
                            norm.weight                        [hidden]
                            lm_head.weight                     [draft_vocab, hidden]
                            d2t  int64 [draft_vocab]   target id = draft id + d2t[draft id]
                            t2d  bool  [vocab]         whether a target id is in the draft vocab

No embedding: the head shares the target's, as vLLM does when the file has none.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ladle.spec_decode.train.eagle3_head import Eagle3Head, Eagle3HeadConfig

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def layout_shapes(config: Eagle3HeadConfig) -> dict[str, tuple[int, ...]]:
    """Every key of model.safetensors and its shape, from the config alone."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    attention = "midlayer.self_attn."
    return {
        "fc.weight": (hidden, 3 * config.target_hidden_size),
        attention + "q_proj.weight": (q_rows, 2 * hidden),
        attention + "k_proj.weight": (kv_rows, 2 * hidden),
        attention + "v_proj.weight": (kv_rows, 2 * hidden),
        attention + "o_proj.weight": (hidden, q_rows),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "norm.weight": (hidden,),
        "lm_head.weight": (config.draft_vocab_size, hidden),
        "d2t": (config.draft_vocab_size,),
        "t2d": (config.vocab_size,),
    }


def save_head(head: Eagle3Head, out: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write `head` to the folder `out` (created; files in it are replaced): weights in
    `dtype`, d2t int64, t2d bool."""
    from ladle.config import supported_dtypes

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in head.state_dict().items():
        if name in ("d2t", "t2d"):
            tensors[name] = tensor.detach().cpu().contiguous()
        else:
            tensors[name] = tensor.detach().to("cpu", dtype).contiguous()
    expected = layout_shapes(head.config)
    if {name: tuple(t.shape) for name, t in tensors.items()} != expected:
        raise AssertionError("the head's state dict left the EAGLE-3 layout")  # a bug, not input
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    dtype_name = next(name for name, value in supported_dtypes().items() if value == dtype)
    config = head.config.to_hf_dict(dtype_name)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def load_head(folder: Path, device: str | torch.device = "cpu") -> Eagle3Head:
    """The head saved in `folder`, in float32 (for measuring it; serving loads the folder its
    own way)."""
    folder = Path(folder)
    config = Eagle3HeadConfig.from_hf_dict(json.loads((folder / CONFIG_FILE).read_text()))
    tensors = load_file(str(folder / WEIGHTS_FILE), device=str(device))
    draft_ids = tensors["d2t"] + torch.arange(len(tensors["d2t"]), device=tensors["d2t"].device)
    head = Eagle3Head(config, draft_ids).to(device)
    head.load_state_dict(
        {
            name: tensor.float() if tensor.is_floating_point() else tensor
            for name, tensor in tensors.items()
        }
    )
    return head.eval()
