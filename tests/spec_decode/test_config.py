"""--speculative-config / LLM(speculative_config=...): vLLM's keys, parsed into
SpeculativeConfig at start-up, bad values refused with the field's name."""

from __future__ import annotations

import pytest

from ladle.cli.engine_args import engine_options_from_args
from ladle.cli.main import build_parser
from ladle.config import EngineConfig, SpeculativeConfig


def test_the_flag_reaches_the_scheduler_config():
    args = build_parser().parse_args(
        ["serve", "--speculative-config",
         '{"method": "suffix", "num_speculative_tokens": 6, "prompt_lookup_max": 7}']
    )
    config = EngineConfig.from_kwargs(**engine_options_from_args(args))
    assert config.scheduler.speculative == SpeculativeConfig(
        method="suffix", num_speculative_tokens=6, prompt_lookup_max=7
    )
    assert EngineConfig.from_kwargs().scheduler.speculative is None


def test_a_flag_that_is_not_json_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--speculative-config", "{method: ngram}"])
    assert "speculative-config" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"method": "eagle"}, "speculative_config.model is required"),
        ({"method": "medusa", "model": "some/head"}, "method='medusa' is not yet supported"),
        ({"method": "draft_model", "model": ""}, "speculative_config.model must be a path"),
        ({"method": "draft_model", "model": "random"}, "needs method eagle3 or auto"),
        ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min"),
        ({"method": "suffix", "suffix_max_cached_requests": -1}, "suffix_max_cached_requests"),
        ({"method": "ngram", "adaptive": "yes"}, "adaptive"),
        ({"method": "ngram", "model": "x"}, "model is not used by method 'ngram'"),
        ({"method": "ngram", "draft_model": "x"}, "unknown key(s) 'draft_model'"),
    ],
)
def test_bad_values_name_their_field(options, field):
    with pytest.raises(ValueError) as error:
        EngineConfig.from_kwargs(speculative_config=options)
    assert field in str(error.value) and "speculative_config" in str(error.value)
