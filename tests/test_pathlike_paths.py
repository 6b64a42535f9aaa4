"""Issue 32: paths may be os.PathLike (pathlib.Path) wherever a model, tokenizer or file path is
taken: the offline LLM, the CLI's argv, and `ladle quantize`."""

from __future__ import annotations

from pathlib import Path

from ladle import LLM, SamplingParams
from ladle.cli.main import main
from ladle.config import EngineConfig
from ladle.model.default_model import resolve_default_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=3)


def test_config_turns_paths_into_text():
    config = EngineConfig.from_kwargs(
        model=Path("models/m.gguf"), tokenizer=Path("tok"), download_dir=Path("cache")
    ).model
    assert (config.model, config.tokenizer, config.download_dir) == ("models/m.gguf", "tok",
                                                                      "cache")


def test_llm_takes_the_default_models_path_as_resolve_default_model_returns_it():
    # A Path to a .gguf file: the loader read its suffix with str.lower() (AttributeError).
    path = resolve_default_model()
    assert isinstance(path, Path) and path.suffix == ".gguf"
    output = LLM(path, num_kv_blocks=16).generate(["Hi"], GREEDY, use_tqdm=False)[0]
    assert len(output.outputs[0].token_ids) == 3


def test_llm_takes_path_model_tokenizer_and_chat_template(tiny_model_path, tmp_path):
    folder = tiny_model_path("llama")
    expected = LLM(folder, num_kv_blocks=64).generate(["the cat"], GREEDY, use_tqdm=False)[0]
    llm = LLM(Path(folder), tokenizer=Path(folder), num_kv_blocks=64)
    got = llm.generate(["the cat"], GREEDY, use_tqdm=False)[0]
    assert got.outputs[0].token_ids == expected.outputs[0].token_ids
    text = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    template = tmp_path / "template.jinja"
    template.write_text(text)
    conversation = [[{"role": "user", "content": "the cat"}]]
    [from_file] = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=template)
    [inline] = llm.chat(conversation, GREEDY, use_tqdm=False, chat_template=text)
    assert from_file.prompt_token_ids == inline.prompt_token_ids


def test_cli_takes_paths_in_argv(tiny_model_path, tmp_path, capsys):
    folder = Path(tiny_model_path("llama"))
    code = main(["generate", folder, "--prompt", "the cat", "--max-tokens", "3",
                 "--num-kv-blocks", "64"])
    assert code == 0, capsys.readouterr().err
    out = tmp_path / "int8"
    code = main(["quantize", folder, out, "--method", "int8", "--dtype", "float32"])
    assert code == 0, capsys.readouterr().err
    assert (out / "config.json").is_file()
