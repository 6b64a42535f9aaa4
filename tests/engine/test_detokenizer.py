"""IncrementalDetokenizer on real tokenizers trained in-process (no hub).

Three decoders that break naive per-token decoding in different ways:
- byte-level BPE (GPT-2/Qwen style): characters split across tokens at the byte level;
- Metaspace BPE (SentencePiece style): the decoder drops the first token's leading space;
- byte-fallback BPE (Llama style): <0xNN> byte tokens, Fuse + Strip in the decoder.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ladle.frontend.detokenizer import IncrementalDetokenizer
from ladle.frontend.stop_checker import StopChecker

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello again!",
    "Café, naïve, résumé, façade, Ångström, crème brûlée, São Paulo, Zürich.",
    "日本語のテキストと中文文本，还有한국어 텍스트。東京は晴れです。",
    "Emoji: 😀🎉👍🏽 🇫🇷 ❤️ and math ∑∫√ ≈ ≠ — done.",
    "def add(a, b):\n    return a + b  # tabs\tand newlines\n",
] * 3

REAL_TEXTS = [
    "Hello world, hello again!",
    "Café naïve résumé — crème brûlée in Zürich.",
    "東京は晴れです。中文文本，한국어 텍스트。",
    "Party time 😀🎉👍🏽 🇫🇷 ❤️ ∑∫√ ≈ ≠",
    "  leading spaces, 'quotes' and\nnew lines\t😀 end",
    "mixed: café 日本 😀 ok",
]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>"]


def _wrap(tokenizer: Tokenizer, **kwargs: Any) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, clean_up_tokenization_spaces=False, **kwargs
    )


@pytest.fixture(scope="module")
def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # A small vocab: most non-ASCII characters stay split into several byte tokens.
    trainer = trainers.BpeTrainer(
        vocab_size=340,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return _wrap(tokenizer, eos_token="<|endoftext|>", additional_special_tokens=["<|im_start|>"])


@pytest.fixture(scope="module")
def metaspace_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return _wrap(tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    # Train a plain BPE on a small alphabet, then rebuild it with <0xNN> byte tokens.
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=200, limit_alphabet=40, special_tokens=["<unk>"], show_progress=False
    )
    trained.train_from_iterator(CORPUS, trainer)
    trained_model = json.loads(trained.to_str())["model"]
    special = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    vocab: dict[str, int] = {}
    for token in [*special, *byte_tokens, *trained_model["vocab"]]:
        vocab.setdefault(token, len(vocab))
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained_model["merges"]
    ]
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = trained.normalizer
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tokenizer.add_special_tokens(special)
    return _wrap(tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


ALL_TOKENIZERS = ["byte_level_tokenizer", "metaspace_tokenizer", "byte_fallback_tokenizer"]


def random_token_ids(tokenizer: Any, rng: random.Random, special_ids: list[int]) -> list[int]:
    """Random ids over the whole vocab, specials sprinkled in more often than chance.

    ByteFallback decodes a run of <0xNN> tokens all or nothing: one bad byte turns the whole run
    into U+FFFDs, even bytes already streamed as text. No streaming decoder can take that back,
    and models only emit byte tokens that spell whole characters, so for byte-fallback
    tokenizers each byte token is replaced by the bytes of one random whole character.
    """
    byte_token_ids = {
        tokenizer.convert_tokens_to_ids(f"<0x{byte:02X}>") for byte in range(256)
    } & set(range(len(tokenizer)))
    byte_token_ids.discard(tokenizer.unk_token_id)
    characters = "".join(REAL_TEXTS)
    token_ids: list[int] = []
    for _ in range(rng.randint(0, 40)):
        token_id = rng.choice(special_ids) if rng.random() < 0.1 else rng.randrange(len(tokenizer))
        if token_id in byte_token_ids:
            token_ids.extend(
                tokenizer.convert_tokens_to_ids(f"<0x{byte:02X}>")
                for byte in rng.choice(characters).encode()
            )
        else:
            token_ids.append(token_id)
    return token_ids


def random_chunks(token_ids: list[int], rng: random.Random, max_chunk: int = 4) -> list[list[int]]:
    chunks, start = [], 0
    while start < len(token_ids):
        size = rng.randint(1, max_chunk)
        chunks.append(token_ids[start : start + size])
        start += size
    return chunks


def stream(detokenizer: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    deltas = [detokenizer.add_tokens(chunk) for chunk in chunks]
    deltas.append(detokenizer.flush())
    assert "".join(deltas) == detokenizer.text
    return deltas


def full_decode(tokenizer: Any, token_ids: list[int], skip_special_tokens: bool) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("tokenizer_name", ALL_TOKENIZERS)
def test_random_token_streams_equal_full_decode(
    tokenizer_name: str, skip_special_tokens: bool, request: pytest.FixtureRequest
) -> None:
    tokenizer = request.getfixturevalue(tokenizer_name)
    rng = random.Random(len(tokenizer_name) * 2 + skip_special_tokens)
    special_ids = tokenizer.all_special_ids
    for _ in range(150):
        token_ids = random_token_ids(tokenizer, rng, special_ids)
        detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens)
        stream(detokenizer, random_chunks(token_ids, rng))
        assert detokenizer.text == full_decode(tokenizer, token_ids, skip_special_tokens)
        assert detokenizer.token_ids == token_ids


@pytest.mark.parametrize("tokenizer_name", ALL_TOKENIZERS)
def test_real_text_streams_without_replacement_characters(
    tokenizer_name: str, request: pytest.FixtureRequest
) -> None:
    tokenizer = request.getfixturevalue(tokenizer_name)
    rng = random.Random(7)
    num_split_characters = 0
    for text in REAL_TEXTS:
        token_ids = tokenizer.encode(text, add_special_tokens=False)
        num_split_characters += sum("\ufffd" in tokenizer.decode([t]) for t in token_ids)
        expected = full_decode(tokenizer, token_ids, True)
        assert "\ufffd" not in expected
        for max_chunk in (1, 1, 2, 3, 5):
            detokenizer = IncrementalDetokenizer(tokenizer, [])
            deltas = stream(detokenizer, random_chunks(token_ids, rng, max_chunk))
            assert "".join(deltas) == expected
            assert not any("\ufffd" in delta for delta in deltas)
            assert deltas[-1] == ""  # nothing was left waiting for flush()
    if tokenizer_name != "metaspace_tokenizer":  # Metaspace maps unknown chars to <unk>
        assert num_split_characters > 5, "the test needs characters split across tokens"


def test_real_text_round_trips_exactly_for_byte_level(byte_level_tokenizer: Any) -> None:
    for text in REAL_TEXTS:
        token_ids = byte_level_tokenizer.encode(text, add_special_tokens=False)
        detokenizer = IncrementalDetokenizer(byte_level_tokenizer, [])
        stream(detokenizer, [[t] for t in token_ids])
        assert detokenizer.text == text


@pytest.mark.parametrize("tokenizer_name", ALL_TOKENIZERS)
def test_prompt_context_gives_the_continuation(
    tokenizer_name: str, request: pytest.FixtureRequest
) -> None:
    """Split real text into prompt + output anywhere: the output is what follows the prompt."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    rng = random.Random(11)
    for text in REAL_TEXTS:
        token_ids = tokenizer.encode(text, add_special_tokens=False)
        for split in range(1, len(token_ids)):
            prompt, output = token_ids[:split], token_ids[split:]
            prompt_text = tokenizer.decode(prompt, skip_special_tokens=True)
            # A byte-fallback prompt cut inside a character decodes to one U+FFFD per byte
            # token, so its length says nothing about where the continuation starts.
            if tokenizer_name == "byte_fallback_tokenizer" and prompt_text.endswith("\ufffd"):
                continue
            detokenizer = IncrementalDetokenizer(tokenizer, prompt)
            stream(detokenizer, random_chunks(output, rng))
            whole = tokenizer.decode(token_ids, skip_special_tokens=True)
            assert detokenizer.text == whole[len(prompt_text) :]


def test_first_output_token_keeps_its_leading_space(metaspace_tokenizer: Any) -> None:
    prompt = metaspace_tokenizer.encode("Hello", add_special_tokens=False)
    output = metaspace_tokenizer.encode("world again", add_special_tokens=False)
    assert metaspace_tokenizer.convert_ids_to_tokens(output)[0].startswith("▁")
    detokenizer = IncrementalDetokenizer(metaspace_tokenizer, prompt)
    assert detokenizer.add_tokens(output[:1]).startswith(" ")
    detokenizer.add_tokens(output[1:])
    assert detokenizer.text == " world again"
    # Without a prompt there is nothing to separate from: no leading space, like decode().
    detokenizer = IncrementalDetokenizer(metaspace_tokenizer, [])
    stream(detokenizer, [[t] for t in output])
    assert detokenizer.text == "world again" == metaspace_tokenizer.decode(output)


@pytest.mark.parametrize("tokenizer_name", ALL_TOKENIZERS)
def test_special_tokens_skipped_or_kept(
    tokenizer_name: str, request: pytest.FixtureRequest
) -> None:
    tokenizer = request.getfixturevalue(tokenizer_name)
    eos = tokenizer.eos_token_id
    words = [tokenizer.encode(w, add_special_tokens=False) for w in ("Hello", " world", " again")]
    token_ids = [eos, *words[0], eos, *words[1], eos, eos, *words[2], eos]
    for skip in (True, False):
        detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip)
        stream(detokenizer, [[t] for t in token_ids])
        assert detokenizer.text == tokenizer.decode(token_ids, skip_special_tokens=skip)
        assert (tokenizer.eos_token in detokenizer.text) is not skip


def test_special_tokens_byte_level_exact(byte_level_tokenizer: Any) -> None:
    tokenizer = byte_level_tokenizer
    token_ids = [
        *tokenizer.encode("hi 😀", add_special_tokens=False),
        tokenizer.eos_token_id,
        *tokenizer.encode(" there", add_special_tokens=False),
        tokenizer.convert_tokens_to_ids("<|im_start|>"),
    ]
    skipped = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=True)
    kept = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
    stream(skipped, [[t] for t in token_ids])
    stream(kept, [[t] for t in token_ids])
    assert skipped.text == "hi 😀 there"
    assert kept.text == "hi 😀<|endoftext|> there<|im_start|>"


def test_batch_ending_mid_character_emits_its_complete_part(byte_level_tokenizer: Any) -> None:
    tokenizer = byte_level_tokenizer
    token_ids = tokenizer.encode("hello 😀", add_special_tokens=False)
    assert "\ufffd" in tokenizer.decode(token_ids[:-1])  # the emoji is split
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    delta = detokenizer.add_tokens(token_ids[:-1])
    assert delta.startswith("hello") and "\ufffd" not in delta
    assert delta + detokenizer.add_tokens(token_ids[-1:]) == "hello 😀"


def test_incomplete_character_at_the_end_is_flushed(byte_level_tokenizer: Any) -> None:
    tokenizer = byte_level_tokenizer
    token_ids = tokenizer.encode("ok 😀", add_special_tokens=False)[:-1]
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    deltas = [detokenizer.add_tokens([t]) for t in token_ids]
    assert "\ufffd" not in "".join(deltas)
    assert detokenizer.flush().endswith("\ufffd")
    assert detokenizer.text == tokenizer.decode(token_ids)
    assert detokenizer.flush() == ""


def test_padded_vocab_ids_decode_to_nothing(byte_level_tokenizer: Any) -> None:
    # Models pad their embedding past the tokenizer; such an id must not break the stream.
    tokenizer = byte_level_tokenizer
    detokenizer = IncrementalDetokenizer(tokenizer, [1, len(tokenizer) + 3])
    hi_ids = tokenizer.encode("hi", add_special_tokens=False)
    there_ids = tokenizer.encode(" there", add_special_tokens=False)
    padding_ids = [len(tokenizer), len(tokenizer) + 1000]
    deltas = [detokenizer.add_tokens(hi_ids), detokenizer.add_tokens(padding_ids)]
    deltas.append(detokenizer.add_tokens(there_ids))
    assert deltas == ["hi", "", " there"]
    assert detokenizer.token_ids == hi_ids + padding_ids + there_ids


def test_negative_id_raises_and_leaves_state_alone(byte_level_tokenizer: Any) -> None:
    tokenizer = byte_level_tokenizer
    detokenizer = IncrementalDetokenizer(tokenizer, [])
    hi_ids = tokenizer.encode("hi", add_special_tokens=False)
    detokenizer.add_tokens(hi_ids)
    with pytest.raises(ValueError, match="token id -1 is negative"):
        detokenizer.add_tokens([tokenizer.encode("x")[0], -1])
    assert detokenizer.text == "hi" and detokenizer.token_ids == hi_ids


class CountingTokenizer:
    """Delegates to a tokenizer, counting how many ids each decode() is given."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.max_ids_per_decode = 0

    def __len__(self) -> int:
        return len(self.tokenizer)

    def decode(self, token_ids: list[int], **kwargs: Any) -> str:
        self.max_ids_per_decode = max(self.max_ids_per_decode, len(token_ids))
        return self.tokenizer.decode(token_ids, **kwargs)


@pytest.mark.parametrize("tokenizer_name", ALL_TOKENIZERS)
def test_each_step_decodes_a_small_window(
    tokenizer_name: str, request: pytest.FixtureRequest
) -> None:
    tokenizer = request.getfixturevalue(tokenizer_name)
    counting = CountingTokenizer(tokenizer)
    prompt = tokenizer.encode(" ".join(REAL_TEXTS), add_special_tokens=False)
    output = prompt * 20  # long output: thousands of tokens
    detokenizer = IncrementalDetokenizer(counting, prompt)
    for token_id in output:
        detokenizer.add_tokens([token_id])
    detokenizer.flush()
    # A window is a few context tokens plus those of one (multi-token) character.
    assert counting.max_ids_per_decode <= 12
    assert len(output) > 1000
    whole = tokenizer.decode(prompt + output, skip_special_tokens=True)
    assert detokenizer.text == whole[len(tokenizer.decode(prompt, skip_special_tokens=True)) :]


def test_streaming_with_stop_strings_end_to_end(byte_level_tokenizer: Any) -> None:
    """The front end's loop: detokenize, check, stream up to safe_length, stop on a match."""
    tokenizer = byte_level_tokenizer
    text = "Café 日本 😀 answer: 42 </stop> never shown"
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    for include in (False, True):
        detokenizer = IncrementalDetokenizer(tokenizer, [])
        checker = StopChecker(["</stop>", "NEVER"], include)
        streamed, num_streamed = [], 0
        for token_id in token_ids:
            delta = detokenizer.add_tokens([token_id])
            result = checker.check(detokenizer.text, len(delta))
            streamed.append(detokenizer.text[num_streamed : result.safe_length])
            num_streamed = result.safe_length
            if result.matched:
                break
        assert result.matched and result.stop_string == "</stop>"
        expected = "Café 日本 😀 answer: 42 " + ("</stop>" if include else "")
        assert result.truncated_text == expected == "".join(streamed)
        assert not any("\ufffd" in piece or ("</" in piece and not include) for piece in streamed)


class DecodeCountingFastTokenizer(CountingTokenizer):
    """CountingTokenizer that keeps the Rust backend, so the DecodeStream path can serve."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.backend_tokenizer = tokenizer.backend_tokenizer
        self.num_decodes = 0

    def decode(self, token_ids: list[int], **kwargs: Any) -> str:
        self.num_decodes += 1
        return super().decode(token_ids, **kwargs)


@pytest.mark.parametrize("tokenizer_name", ALL_TOKENIZERS)
def test_one_token_steps_take_the_decode_stream_path(
    tokenizer_name: str, request: pytest.FixtureRequest
) -> None:
    """Streaming one token a step, a fast tokenizer's text comes from DecodeStream: Python-side
    decode() runs a handful of times for a thousand tokens, and the text is still exact."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    counting = DecodeCountingFastTokenizer(tokenizer)
    prompt = tokenizer.encode("Hello world", add_special_tokens=False)
    output = tokenizer.encode(" ".join(REAL_TEXTS), add_special_tokens=False) * 10
    detokenizer = IncrementalDetokenizer(counting, prompt)
    deltas = stream(detokenizer, [[t] for t in output])
    assert len(output) > 500 and counting.num_decodes < 10
    whole = tokenizer.decode(prompt + output, skip_special_tokens=True)
    assert detokenizer.text == whole[len(tokenizer.decode(prompt, skip_special_tokens=True)) :]
    if tokenizer_name != "byte_fallback_tokenizer":  # its unknown characters are byte runs
        assert not any("\ufffd" in delta for delta in deltas)


@pytest.mark.parametrize("tokenizer_name", ALL_TOKENIZERS)
def test_fast_and_slow_paths_give_the_same_deltas(
    tokenizer_name: str, request: pytest.FixtureRequest
) -> None:
    """Random ids (special tokens, split characters, padding ids), one or several a step, with
    and without a prompt that may end inside a character: both paths, delta for delta."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    slow_tokenizer = CountingTokenizer(tokenizer)  # no backend_tokenizer: the slow path alone
    rng = random.Random(5)
    special_ids = tokenizer.all_special_ids
    for _ in range(30):
        token_ids = random_token_ids(tokenizer, rng, special_ids)
        split = rng.randrange(len(token_ids) + 1)
        prompt, output = token_ids[:split], token_ids[split:]
        chunks = random_chunks(output, rng, max_chunk=rng.choice([1, 1, 3]))
        for skip in (True, False):
            fast = IncrementalDetokenizer(tokenizer, prompt, skip)
            slow = IncrementalDetokenizer(slow_tokenizer, prompt, skip)
            assert stream(fast, chunks) == stream(slow, chunks)
