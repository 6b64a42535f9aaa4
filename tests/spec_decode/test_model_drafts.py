"""Drafts computed by a network in the worker (draft_model, EAGLE-1, EAGLE-3, auto), end to end
on the CPU in fp32 with a tiny random llama: tokens equal those without speculation (greedy and
seeded, batched and alone), a draft model that is the target itself accepts nearly everything
(which holds only if its KV, positions and lookahead slots are right), the emitted distribution
at temperature 1 is the target's, a failing drafter never ends a request, and bad configs are
refused at start-up naming the field."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch
from helpers.eagle_heads import save_eagle_head
from helpers.spec_prompts import first_token_ids
from helpers.tiny_models import save_tiny_model

from ladle import LLM, SamplingParams

# Small blocks and a small step budget: lookahead slots cross block ends and prompts chunk.
ENGINE_OPTIONS = {
    "cpu_kv_cache_gib": 0.05, "block_size": 4, "max_num_seqs": 64, "max_num_batched_tokens": 96
}


def _prompts(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"prompt_token_ids": [rng.randrange(5, 500) for _ in range(rng.randint(2, 40))]}
        for _ in range(count)
    ]


@pytest.fixture(scope="module")
def model_path(tiny_model_path):
    return tiny_model_path("llama")


@pytest.fixture(scope="module")
def heads(model_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    return {
        "eagle3": save_eagle_head(root, model_path, "eagle3", draft_vocab_size=128),
        "eagle3_full": save_eagle_head(root, model_path, "eagle3"),
        "eagle": save_eagle_head(root, model_path, "eagle"),
    }


@pytest.fixture(scope="module")
def engine_off(model_path):
    return LLM(model_path, **ENGINE_OPTIONS)


def _engine(model_path, method, draft, adaptive=False, k=4, **options):
    config = {"method": method, "model": draft, "num_speculative_tokens": k, "adaptive": adaptive}
    return LLM(model_path, speculative_config=config, **ENGINE_OPTIONS, **options)


@pytest.fixture(scope="module")
def engines(model_path, heads):
    return {
        "draft_model": _engine(model_path, "draft_model", model_path),
        "eagle3": _engine(model_path, "eagle3", heads["eagle3"]),
        "eagle": _engine(model_path, "eagle", heads["eagle"]),
    }


GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.mark.parametrize("method", ["draft_model", "eagle3", "eagle"])
def test_greedy_tokens_equal_those_without_speculation(engines, engine_off, method):
    prompts = _prompts(128)
    expected = first_token_ids(engine_off.generate(prompts, GREEDY, use_tqdm=False))
    llm = engines[method]
    before = llm.engine.get_stats().spec_decode
    got = first_token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))
    assert got == expected
    stats = llm.engine.get_stats()
    spec = stats.spec_decode
    drafted = spec.num_draft_tokens - before.num_draft_tokens
    accepted = spec.num_accepted_tokens - before.num_accepted_tokens
    assert drafted > 128 * 8  # every request was drafted for, step after step
    if method == "draft_model":
        # The draft is the target: it proposes the target's own argmax, so nearly every draft
        # is accepted (fp32 ties aside) -- only if its KV, positions and lookahead are right.
        assert accepted >= 0.97 * drafted
    assert spec.drafting_seconds > before.drafting_seconds  # the drafter's time is counted
    assert stats.num_free_blocks == stats.num_total_blocks  # lookahead slots all given back


def test_adaptive_and_overlapped_draft_model(model_path, engine_off):
    """Adaptive lengths and overlapped scheduling (undrafted requests run with their token
    in flight, drafted ones wait): same tokens, drafts still accepted."""
    llm = _engine(model_path, "draft_model", model_path, adaptive=True, async_scheduling=True)
    prompts = _prompts(48, seed=1)
    expected = first_token_ids(engine_off.generate(prompts, GREEDY, use_tqdm=False))
    assert first_token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
    spec = llm.engine.get_stats().spec_decode
    assert spec.num_accepted_tokens > 0.9 * spec.num_draft_tokens > 0


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_seeded_requests_are_batch_invariant(engines, engine_off, method):
    llm = engines[method]
    prompts = _prompts(10, seed=2)
    seeded = [
        SamplingParams(temperature=0.9, top_p=0.95, seed=50 + i, max_tokens=16, ignore_eos=True)
        for i in range(len(prompts))
    ]
    together = first_token_ids(llm.generate(prompts, seeded, use_tqdm=False))
    alone = [
        first_token_ids(llm.generate([p], [s], use_tqdm=False))[0]
        for p, s in zip(prompts, seeded)
    ]
    without = first_token_ids(engine_off.generate(prompts, seeded, use_tqdm=False))
    assert together == alone == without


def _homogeneity_p_value(first: torch.Tensor, second: torch.Tensor) -> float:
    """Pearson's two-sample chi-square test that two count vectors share a distribution
    (bins with fewer than 10 counts in all pooled)."""
    total = first + second
    small = total < 10
    first = torch.cat([first[~small], first[small].sum().reshape(1)]).double()
    second = torch.cat([second[~small], second[small].sum().reshape(1)]).double()
    keep = (first + second) > 0
    first, second = first[keep], second[keep]
    n1, n2 = first.sum(), second.sum()
    pooled = (first + second) / (n1 + n2)
    statistic = (((first - n1 * pooled) ** 2) / (n1 * pooled)).sum() + (
        ((second - n2 * pooled) ** 2) / (n2 * pooled)
    ).sum()
    dof = first.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), statistic / 2.0))


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_emitted_distribution_equals_the_target(engines, engine_off, method):
    """Temperature 1 and top-p 0.9, one prompt, 1200 requests with speculation and 1200 with
    other seeds without: the second and third tokens (verify rows after model drafts) follow
    the same distribution (p > 0.01); the teeth: temperature 0.5 without speculation does not."""
    prompt = [_prompts(1, seed=3)[0]] * 1200

    def counts(llm, seed0, temperature=1.0):
        params = [
            SamplingParams(temperature=temperature, top_p=0.9, seed=seed0 + i, max_tokens=3,
                           ignore_eos=True)
            for i in range(len(prompt))
        ]
        tokens = first_token_ids(llm.generate(prompt, params, use_tqdm=False))
        pairs = torch.tensor([t[1] * 512 + t[2] for t in tokens])
        return torch.bincount(torch.tensor([t[1] for t in tokens]), minlength=512), torch.bincount(
            pairs % 512, minlength=512
        )

    llm = engines[method]
    before = llm.engine.get_stats().spec_decode.num_drafts
    with_spec = counts(llm, 0)
    assert llm.engine.get_stats().spec_decode.num_drafts - before > 1000
    without = counts(engine_off, 100_000)
    colder = counts(engine_off, 200_000, temperature=0.5)
    for got, expected, teeth in zip(with_spec, without, colder):
        assert _homogeneity_p_value(got, expected) > 0.01
        assert _homogeneity_p_value(teeth, expected) < 1e-6


def test_auto_picks_suffix_or_the_model(model_path, engine_off):
    """auto with a draft model: per request the source that accepts more. Tokens unchanged;
    the draft model (the target itself) is the better source here, so it is used."""
    llm = LLM(
        model_path,
        speculative_config={"method": "auto", "model": model_path, "num_speculative_tokens": 3},
        **ENGINE_OPTIONS,
    )
    prompts = _prompts(32, seed=4)
    expected = first_token_ids(engine_off.generate(prompts, GREEDY, use_tqdm=False))
    assert first_token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected
    spec = llm.engine.get_stats().spec_decode
    assert spec.num_accepted_tokens > 0.8 * spec.num_draft_tokens > 0


def test_a_failing_drafter_never_ends_a_request(model_path, engine_off):
    llm = _engine(model_path, "draft_model", model_path)
    drafter = llm.engine.executor.worker.runner.drafter
    original = drafter._chain
    calls = 0

    def sometimes_failing(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls % 3 == 0:
            raise RuntimeError("injected drafter fault")
        return original(*args, **kwargs)

    drafter._chain = sometimes_failing
    prompts = _prompts(24, seed=5)
    expected = engine_off.generate(prompts, GREEDY, use_tqdm=False)
    got = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert first_token_ids(got) == first_token_ids(expected)
    assert all(output.outputs[0].finish_reason == "length" for output in got)
    assert drafter.num_failures > 0 and llm.engine.get_stats().spec_decode.num_accepted_tokens > 0


# ----- bad input ------------------------------------------------------------------------------


def _refused(model_path, config) -> str:
    with pytest.raises(ValueError) as error:
        LLM(model_path, speculative_config=config, **ENGINE_OPTIONS)
    return str(error.value)


def test_a_draft_model_of_another_vocabulary_is_refused(model_path, tmp_path):
    other = save_tiny_model(tmp_path, "llama", vocab_size=600)
    message = _refused(model_path, {"method": "draft_model", "model": other})
    assert "speculative_config.model" in message and "vocab_size is 600" in message


def test_a_draft_model_of_another_tokenizer_is_refused(model_path, tmp_path):
    other = Path(shutil.copytree(model_path, tmp_path / "other_tokenizer"))
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = list(vocab)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    message = _refused(model_path, {"method": "draft_model", "model": str(other)})
    assert "speculative_config.model" in message and "tokenizer differs" in message


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"hidden_size": 32}, "hidden_size is 32"),
        ({"vocab_size": 600}, "vocab_size is 600"),
        ({"target_hidden_size": 128}, "target_hidden_size is 128"),
    ],
)
def test_a_head_of_another_shape_is_refused(model_path, tmp_path, overrides, field):
    head = save_eagle_head(tmp_path, model_path, "eagle3", **overrides)
    message = _refused(model_path, {"method": "eagle3", "model": head})
    assert "speculative_config.model" in message and field in message


def test_pickled_heads_missing_tensors_and_wrong_methods_are_refused(model_path, tmp_path):
    head = Path(save_eagle_head(tmp_path, model_path, "eagle3", name="pickled"))
    (head / "model.safetensors").rename(head / "pytorch_model.bin")
    message = _refused(model_path, {"method": "eagle3", "model": str(head)})
    assert "safetensors only" in message and "pytorch_model.bin" in message
    partial = save_eagle_head(tmp_path, model_path, "eagle3", name="partial",
                              draft_vocab_size=128, drop=("d2t", "norm.weight"))
    message = _refused(model_path, {"method": "eagle3", "model": partial})
    assert "lacks d2t, norm.weight" in message
    eagle1 = save_eagle_head(tmp_path, model_path, "eagle")
    message = _refused(model_path, {"method": "eagle3", "model": eagle1})
    assert "is an eagle head" in message
    message = _refused(model_path, {"method": "draft_model", "model": str(tmp_path / "nowhere")})
    assert "speculative_config.model" in message and "does not exist" in message
    message = _refused(model_path, {"method": "eagle3", "model": "random"})
    assert "load_format='dummy'" in message


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"method": "draft_model"}, "speculative_config.model is required"),
        ({"method": "eagle3", "model": "x", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "eagle", "model": "x", "num_speculative_tokens": 17}, "num_speculative_tokens"),
        ({"method": "eagle4", "model": "x"}, "speculative_config.method must be one of"),
    ],
)
def test_bad_configs_name_their_field(model_path, config, field):
    assert field in _refused(model_path, config)


def test_random_head_on_dummy_weights_drafts(engine_off):
    """The benchmark head: `model: random` with --load-format dummy drafts (and verifies)."""
    llm = LLM(
        "tiny-llama",
        load_format="dummy",
        speculative_config={"method": "eagle3", "model": "random", "num_speculative_tokens": 2},
        **ENGINE_OPTIONS,
    )
    outputs = llm.generate(_prompts(4), GREEDY, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 20 for o in outputs)
    assert llm.engine.get_stats().spec_decode.num_draft_tokens > 0
    assert math.isfinite(llm.engine.get_stats().spec_decode.drafting_seconds)


def test_eagle3_target_runs_without_its_drafter(engines, engine_off):
    """A benchmark's baseline sets the drafter aside: the target still appends its aux hidden
    states, and the runner still splits them off (a bug once: logits of a 4h-wide row)."""
    llm = engines["eagle3"]
    runner = llm.engine.executor.worker.runner
    proposer, llm.engine.scheduler.proposer = llm.engine.scheduler.proposer, None
    drafter, runner.drafter = runner.drafter, None
    try:
        prompts = _prompts(8, seed=6)
        got = first_token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))
    finally:
        runner.drafter, llm.engine.scheduler.proposer = drafter, proposer
    assert got == first_token_ids(engine_off.generate(prompts, GREEDY, use_tqdm=False))
