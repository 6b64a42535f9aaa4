"""Engine flags generated from the config dataclasses: every field is a flag with help text,
vLLM's spellings and ladle's earlier names both work, sizes like 32k parse, --config YAML files
are read with the command line winning, and the parsed options build the same EngineConfig."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from ladle.cli.engine_args import (
    ENGINE_CONFIG_CLASSES,
    NOT_FLAGS,
    add_engine_arguments,
    engine_options_from_args,
    expand_config_file,
    parse_size,
)
from ladle.cli.main import build_parser
from ladle.config import EngineConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return parser.parse_args(list(argv))


def test_every_config_field_is_a_flag_with_help() -> None:
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    actions = {action.dest: action for action in parser._actions}
    for config_class in ENGINE_CONFIG_CLASSES.values():
        for field in dataclasses.fields(config_class):
            if field.name in NOT_FLAGS:
                continue
            assert field.name in actions, field.name
            assert field.metadata.get("help"), f"{field.name} has no help text"


def test_defaults_match_the_dataclasses() -> None:
    options = engine_options_from_args(parse())
    assert EngineConfig.from_kwargs(model=None, **options) == EngineConfig()


@pytest.mark.parametrize(
    ("text", "value"),
    [("32k", 32_000), ("32K", 32_768), ("1m", 1_000_000), ("2M", 2 * 2**20), ("4096", 4096)],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value
    assert parse("--max-model-len", text).max_model_len == value


def test_bad_size_is_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        parse("--max-model-len", "lots")
    assert "--max-model-len" in capsys.readouterr().err


def test_vllm_and_legacy_spellings() -> None:
    assert parse("--no-enable-prefix-caching").enable_prefix_caching is False
    assert parse("--no-prefix-caching").enable_prefix_caching is False
    assert parse("--enable-prefix-caching").enable_prefix_caching is True
    assert parse("--num-gpu-blocks-override", "64").num_kv_blocks == 64
    assert parse("--num-kv-blocks", "64").num_kv_blocks == 64
    assert parse("--hf-overrides", '{"rope_theta": 5.0}').hf_overrides == {"rope_theta": 5.0}
    args = build_parser().parse_args(["serve", "m", "--uvicorn-log-level", "warning"])
    assert args.log_level == "warning"


def test_validation_is_the_dataclass_own() -> None:
    options = engine_options_from_args(parse("--block-size", "0"))
    with pytest.raises(ValueError, match="block_size must be in"):
        EngineConfig.from_kwargs(model=None, **options)


def test_config_file_sets_flags_and_the_command_line_wins(tmp_path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "max-model-len: 4k\nmax_num_seqs: 8\nenable-prefix-caching: false\nport: 1234\n"
    )
    argv = expand_config_file(["serve", "some/model", "--config", str(config), "--port", "99"])
    args = build_parser().parse_args(argv)
    assert (args.max_model_len, args.max_num_seqs) == (4000, 8)
    assert args.enable_prefix_caching is False
    assert args.port == 99
    assert args.model == "some/model"


def test_bad_config_file_names_it(tmp_path) -> None:
    with pytest.raises(ValueError, match="cannot read --config file"):
        expand_config_file(["serve", "--config", str(tmp_path / "absent.yaml")])
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        expand_config_file(["serve", "--config", str(tmp_path / "list.yaml")])


def test_python_dash_m_ladle_is_the_cli() -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "ladle", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "--num-gpu-blocks-override" in result.stdout
    assert "scheduler options" in result.stdout


def test_vllm_flags_ladle_settles_are_accepted() -> None:
    args = build_parser().parse_args(
        ["serve", "m", "--trust-remote-code", "--tokenizer-mode", "auto",
         "--enable-auto-tool-choice", "--kv-offloading-size", "2",
         "--kv-offloading-backend", "native"]
    )
    assert args.trust_remote_code and args.enable_auto_tool_choice
    options = engine_options_from_args(args)
    assert "trust_remote_code" not in options  # no engine state: nothing reads them
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--tokenizer-mode", "mistral"])


def test_vllm_offline_options_ladle_settles() -> None:
    """LLM(model, trust_remote_code=True, disable_log_stats=False, quantization=None), as vLLM
    scripts write them, build ladle's default config; a value ladle cannot honour names it."""
    settled = EngineConfig.from_kwargs(
        model=None, trust_remote_code=True, disable_log_stats=False, tokenizer_mode="auto",
        quantization=None, kv_offloading_backend="native",
    )
    assert settled == EngineConfig()
    for option, value in (("tokenizer_mode", "slow"), ("trust_remote_code", "yes"),
                          ("kv_offloading_backend", "lmcache")):
        with pytest.raises(ValueError, match=f"{option}={value!r} is not supported"):
            EngineConfig.from_kwargs(model=None, **{option: value})
    with pytest.raises(ValueError, match="unknown engine option 'swap_spaces'"):
        EngineConfig.from_kwargs(model=None, swap_spaces=4)
