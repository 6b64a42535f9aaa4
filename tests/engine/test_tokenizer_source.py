"""Random weights borrow the default model's tokenizer, and run without one when it cannot be
had (an offline GPU machine running token-id benchmarks must not fail at start-up)."""

import ladle.model.default_model as default_model
from ladle.config import ModelConfig
from ladle.frontend.tokenizer_source import resolve_tokenizer_source


def test_named_tokenizer_wins_then_the_models_own():
    config = ModelConfig(model="tiny-llama", load_format="dummy", tokenizer="some/folder")
    assert resolve_tokenizer_source(config, None) == "some/folder"
    assert resolve_tokenizer_source(ModelConfig(model="x"), "/models/x") == "/models/x"


def test_dummy_weights_without_the_default_model_run_without_a_tokenizer(monkeypatch, capsys):
    def unavailable(*args, **kwargs):
        raise default_model.DefaultModelUnavailableError("could not download the default model")

    monkeypatch.setattr(default_model, "resolve_default_model", unavailable)
    config = ModelConfig(model="qwen3-0.6b", load_format="dummy")
    assert resolve_tokenizer_source(config, None) is None
    assert "without a tokenizer" in capsys.readouterr().err
