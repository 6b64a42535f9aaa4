"""The perplexity bench's pieces: the tolerant ShareGPT reader and which layers each measured
method quantizes."""

from __future__ import annotations

from ladle.model.loader.calibration_text import _complete_records


def test_truncated_json_array_keeps_complete_records():
    text = '[{"id": 1}, {"id": 2},\n {"id": "thr'
    assert _complete_records(text) == [{"id": 1}, {"id": 2}]
    assert _complete_records('[{"id": 1}]') == [{"id": 1}]


def test_layer_methods_quantize_the_decoder_projections_only(tmp_path):
    """fp8 / int4-g128 are measured through the GPU methods' own layers, as `--quantization`
    applies them on CUDA: every decoder projection (fp8: but the last layer's), never the
    embedding or the LM head."""
    import torch
    from helpers.tiny_models import save_tiny_model
    from perplexity import load_for_perplexity

    from ladle.model.layers.linear import Linear

    path = save_tiny_model(tmp_path, "llama", tie_word_embeddings=True)
    for method in ("fp8", "int4-g128"):
        model = load_for_perplexity(path, method)
        linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
        for name, linear in linears.items():
            if method == "fp8" and name.startswith("model.layers.1."):  # the last of two
                assert linear.quant_method is None and linear.weight.dtype == torch.float32
            else:
                assert linear.quant_method.name == method[:4]
        embedding = model.model.embed_tokens
        assert embedding.weight.dtype == torch.float32
        assert getattr(embedding, "quantization", None) is None
