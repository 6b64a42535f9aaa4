"""`ladle train-draft` end to end: prompts -> the target's answers (ladle.LLM) -> the target's
features -> a trained EAGLE-3 head -> its acceptance on held-out prompts -> the folder.

    from ladle.spec_decode.train.pipeline import TrainDraftOptions, train_draft
    summary = train_draft(TrainDraftOptions(model=None, out=Path("head")), prompts=[...])
"""

from __future__ import annotations

import gc
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ladle.spec_decode.train.acceptance import head_drafter, measure_acceptance
from ladle.spec_decode.train.corpus import (
    corpus_token_counts,
    sharegpt_conversations,
    teacher_forced_sequences,
)
from ladle.spec_decode.train.data import (
    choose_draft_vocab,
    encode_chat_prompt,
    generate_answers,
    read_prompts_file,
    sharegpt_prompts,
    vocab_coverage,
)
from ladle.spec_decode.train.eagle3_head import Eagle3Head, Eagle3HeadConfig
from ladle.spec_decode.train.features import SequenceFeatures, collect_features, load_target
from ladle.spec_decode.train.layout import save_head
from ladle.spec_decode.train.trainer import train_head

SUMMARY_FILE = "training_summary.json"
# The shortest answer room worth a prompt: fewer tokens than this teach the head little.
MIN_ANSWER_TOKENS = 8
# ShareGPT conversations tokenized for the draft vocabulary's counts by default: ~3 M tokens
# in ~9 s, whose top 4096 tokens held 86% of the default model's answers' tokens (against 77%
# for the top tokens of 333 answers alone).
DEFAULT_VOCAB_CONVERSATIONS = 2000


@dataclass(frozen=True)
class TrainDraftOptions:
    """Every option of `ladle train-draft` (the CLI's flags, same names)."""

    model: str | None
    out: Path
    num_prompts: int = 512
    held_out: int = 32
    max_new_tokens: int = 256
    temperature: float = 0.0
    epochs: int = 2
    lr: float = 3e-4
    batch_size: int = 4
    max_seq_len: int = 1024
    ttt_steps: int = 5
    draft_vocab_size: int | None = None
    num_speculative_tokens: int = 4
    aux_layer_ids: tuple[int, int, int] | None = None
    device: str = "auto"
    seed: int = 0
    load_format: str = "auto"
    tokenizer: str | None = None
    prompts_file: str | None = None
    save_dtype: str = "bfloat16"
    # CPU threads for the feature pass and training (None: torch's default). On a CPU shared
    # with other work, 1 avoids OpenMP's stalls when a thread is descheduled: a training step
    # of the default model's head measured 10x faster at 1 thread than at 2 on 2 busy cores.
    train_threads: int | None = None
    # ShareGPT conversations added teacher-forced (corpus.py); None: as many as num_prompts
    # when the prompts come from ShareGPT, else 0.
    teacher_forced: int | None = None
    # ShareGPT conversations whose token counts join the answers' to choose the draft
    # vocabulary; None: 2000 when the prompts come from ShareGPT, else 0.
    vocab_conversations: int | None = None
    # Labels on the prompt positions of the generated sequences too, not only the answers'.
    label_prompts: bool = True
    # The training step's autocast: auto is bfloat16 on CUDA and on CPUs with native bfloat16
    # (AVX-512 BF16 or AMX), float32 elsewhere.
    train_dtype: str = "auto"
    # Measure the held-out acceptance every this many steps too (0: at the end only).
    eval_every: int = 0
    overwrite: bool = False
    show_progress: bool = True
    engine_options: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        positive = {
            "num_prompts": self.num_prompts,
            "max_new_tokens": self.max_new_tokens,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "ttt_steps": self.ttt_steps,
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("teacher_forced", "vocab_conversations"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        if self.train_dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(
                f"train_dtype must be auto, float32 or bfloat16, not {self.train_dtype!r}"
            )
        if self.held_out < 0:
            raise ValueError(f"held_out must be >= 0, got {self.held_out}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_seq_len < MIN_ANSWER_TOKENS + 2:
            raise ValueError(
                f"max_seq_len must be >= {MIN_ANSWER_TOKENS + 2}, got {self.max_seq_len}"
            )
        if self.train_threads is not None and self.train_threads < 1:
            raise ValueError(f"train_threads must be >= 1, got {self.train_threads}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size must be >= 1, got {self.draft_vocab_size}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}: CUDA is not available")
        if self.save_dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(
                f"save_dtype must be bfloat16, float16 or float32, not {self.save_dtype!r}"
            )
        out = Path(self.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"out {str(out)!r} exists and is not a folder")
        if out.is_dir() and any(out.iterdir()) and not self.overwrite:
            raise ValueError(f"out {str(out)!r} exists and is not empty (pass --overwrite)")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_train_dtype(self, device: torch.device) -> torch.dtype:
        if self.train_dtype != "auto":
            return getattr(torch, self.train_dtype)
        if device.type == "cuda" or _cpu_has_native_bfloat16():
            return torch.bfloat16
        return torch.float32


def _cpu_has_native_bfloat16() -> bool:
    try:
        with open("/proc/cpuinfo") as file:
            flags = file.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _log(message: str) -> None:
    tqdm.write(f"[ladle train-draft] {message}")


def train_draft(options: TrainDraftOptions, prompts: list[str] | None = None) -> dict:
    """Train a head as `options` say, from `prompts` (else --prompts-file, else ShareGPT), write
    it to options.out and return the summary (also written there as training_summary.json)."""
    options.validate()
    started = time.perf_counter()
    needed = options.num_prompts + options.held_out
    from_sharegpt = prompts is None and options.prompts_file is None
    if prompts is None:
        if options.prompts_file is not None:
            prompts = read_prompts_file(options.prompts_file)
        else:
            prompts = sharegpt_prompts(needed, options.seed)
    if not prompts:
        raise ValueError("prompts: no prompts given")
    prompts = list(prompts)[:needed]
    sequences, dropped, tokenizer = _answer(options, prompts)
    answered = time.perf_counter()
    held_out = sequences[: options.held_out] if len(sequences) > options.held_out else []
    training = sequences[len(held_out) :]
    if not training:
        raise ValueError(
            f"num_prompts: no training sequence left ({len(sequences)} answered, held_out "
            f"{options.held_out}, {dropped} prompts longer than max_seq_len dropped)"
        )
    _log(f"{len(training)} training and {len(held_out)} held-out sequences; {dropped} dropped")
    forced, corpus_counts = _sharegpt_extras(options, from_sharegpt, prompts, tokenizer)
    generated = training
    training = training + forced

    if options.train_threads is not None:
        torch.set_num_threads(options.train_threads)
    device = options.resolved_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model_name = options.model if options.model is not None else _default_model()
    target = load_target(model_name, device, dtype, options.load_format, options.seed)
    vocab_size = target.arch.vocab_size
    draft_vocab_size = options.draft_vocab_size or min(vocab_size, 32000)
    draft_ids = choose_draft_vocab(
        generated, vocab_size, min(draft_vocab_size, vocab_size), corpus_counts
    )
    held_out_coverage = vocab_coverage(draft_ids, held_out)
    if held_out_coverage is not None:
        _log(f"the draft vocabulary holds {held_out_coverage:.1%} of the held-out answers' tokens")
    config = Eagle3HeadConfig.from_target(target.arch, len(draft_ids), options.aux_layer_ids)
    train_features = collect_features(
        target, training, config.aux_layer_ids, show_progress=options.show_progress
    )
    held_features = collect_features(
        target, held_out, config.aux_layer_ids, show_progress=options.show_progress
    )
    featured = time.perf_counter()

    torch.manual_seed(options.seed)
    head = Eagle3Head(config, draft_ids).to(device)
    warm_start_output_(head, target.model, target.lm_head_weight, train_features)
    progress = tqdm(total=None, desc="training", unit="step", disable=not options.show_progress)
    train_dtype = options.resolved_train_dtype(device)
    curve: list[dict] = []
    tokens_seen = 0

    def on_step(step: int, total: int, result) -> None:
        nonlocal tokens_seen
        tokens_seen += result.num_tokens
        progress.total = total
        progress.update(1)
        progress.set_postfix(loss=f"{result.loss:.3f}", acc0=f"{result.accuracies[0]:.2f}")
        # The last step's measurement is the final one, made after training.
        due = options.eval_every and step % options.eval_every == 0 and step < total
        if due and held_features:
            point = measure_acceptance(
                head_drafter(head, target.embedding), held_features, options.num_speculative_tokens
            )
            curve.append({"step": step, "tokens_seen": tokens_seen, **point.as_dict()})
            _log(
                f"step {step}/{total}, {tokens_seen} tokens: held-out acceptance length "
                f"{point.acceptance_length:.3f}"
            )

    results = train_head(
        head,
        train_features,
        target.embedding,
        target.lm_head_weight,
        options.epochs,
        options.lr,
        options.batch_size,
        options.ttt_steps,
        options.seed,
        on_step,
        label_prompts=options.label_prompts,
        autocast_dtype=train_dtype,
    )
    progress.close()
    trained = time.perf_counter()
    acceptance = None
    if held_features:
        drafter = head_drafter(head, target.embedding)
        acceptance = measure_acceptance(drafter, held_features, options.num_speculative_tokens)
        curve.append({"step": len(results), "tokens_seen": tokens_seen, **acceptance.as_dict()})
    save_dtype = getattr(torch, options.save_dtype)
    save_head(head.float(), Path(options.out), save_dtype)
    summary = {
        "model": model_name,
        "out": str(options.out),
        "device": str(device),
        "num_training_sequences": len(training),
        "num_training_tokens": sum(len(ids) for ids, _ in training),
        "num_teacher_forced_sequences": len(forced),
        "num_teacher_forced_tokens": sum(len(ids) for ids, _ in forced),
        "train_dtype": str(train_dtype).removeprefix("torch."),
        "held_out_vocab_coverage": held_out_coverage,
        "num_held_out_sequences": len(held_out),
        "num_dropped_prompts": dropped,
        "draft_vocab_size": len(draft_ids),
        "aux_layer_ids": list(config.aux_layer_ids),
        "num_steps": len(results),
        "first_loss": results[0].loss,
        "last_loss": results[-1].loss,
        "last_accuracies": results[-1].accuracies,
        "seconds": {
            "answers": round(answered - started, 1),
            "features": round(featured - answered, 1),
            "training": round(trained - featured, 1),
            "total": round(time.perf_counter() - started, 1),
        },
        "held_out_acceptance": acceptance.as_dict() if acceptance is not None else None,
        "acceptance_curve": curve,
        "options": {
            key: (str(value) if isinstance(value, Path) else value)
            for key, value in asdict(options).items()
        },
    }
    (Path(options.out) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def warm_start_output_(
    head: Eagle3Head,
    target_model,
    target_lm_head: torch.Tensor,
    features: list[SequenceFeatures],
) -> None:
    """Start the head as the target's own read-out of its high fused layer, at unit scale: fc
    passes that layer's state through divided by its mean RMS over `features` (zero on the
    other two blocks), the attention and MLP branches add nothing (o_proj and down_proj zero,
    as residual branches are often started), and the final norm and LM head are the target's
    (its rows of the draft vocabulary). The head so starts from a calibrated distribution over
    the right tokens, and its layer's updates are not dwarfed by the target's residual stream
    (RMS ~26 on the default model's layer 27: with fc at the default init, or passing it
    through unscaled, the branches must grow ~25x before they move the output, and 3 epochs of
    20k tokens left the held-out acceptance at 1.2)."""
    hidden = head.config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        if head.config.target_hidden_size == hidden and features:
            high = torch.cat([item.aux_hidden[:, 2 * hidden :].float() for item in features])
            rms = float(high.pow(2).mean(-1).sqrt().mean())
            eye = torch.eye(hidden, device=head.fc.weight.device)
            head.fc.weight[:, 2 * hidden :].copy_(eye / max(rms, 1e-6))
        head.midlayer.self_attn.o_proj.weight.zero_()
        head.midlayer.mlp.down_proj.weight.zero_()
        head.norm.weight.copy_(target_model.model.norm.weight.float())
        rows = target_lm_head[head.draft_token_ids.to(target_lm_head.device)]
        head.lm_head.weight.copy_(rows.float())


def _default_model() -> str:
    from ladle.model.default_model import resolve_default_model

    return str(resolve_default_model())


def _sharegpt_extras(
    options: TrainDraftOptions, from_sharegpt: bool, prompts: list[str], tokenizer
) -> tuple[list[tuple[list[int], int]], Counter[int] | None]:
    """(the teacher-forced training sequences, the corpus token counts for the draft
    vocabulary) that options ask for, from ShareGPT conversations other than `prompts`."""
    forced_count = options.teacher_forced
    if forced_count is None:
        forced_count = options.num_prompts if from_sharegpt else 0
    vocab_count = options.vocab_conversations
    if vocab_count is None:
        vocab_count = DEFAULT_VOCAB_CONVERSATIONS if from_sharegpt else 0
    conversations = sharegpt_conversations(max(forced_count, vocab_count), options.seed, prompts)
    forced = teacher_forced_sequences(
        tokenizer, conversations[:forced_count], options.max_seq_len, MIN_ANSWER_TOKENS + 2
    )
    counts = corpus_token_counts(tokenizer, conversations[:vocab_count]) if vocab_count else None
    if forced_count:
        _log(
            f"{len(forced)} teacher-forced ShareGPT conversations "
            f"({sum(len(ids) for ids, _ in forced)} tokens)"
        )
    return forced, counts


def _answer(
    options: TrainDraftOptions, prompts: list[str]
) -> tuple[list[tuple[list[int], int]], int, object]:
    """The target's answers to `prompts` (ladle.LLM, chat template), prompts too long for
    max_seq_len with room for an answer dropped; returns (sequences, number dropped, the
    model's tokenizer)."""
    from ladle.entrypoints.llm import LLM

    engine_options = dict(options.engine_options)
    engine_options.setdefault("seed", options.seed)
    if options.load_format != "auto":
        engine_options.setdefault("load_format", options.load_format)
    if options.tokenizer is not None:
        engine_options.setdefault("tokenizer", options.tokenizer)
    if options.device != "auto":
        engine_options.setdefault("device", options.device.split(":")[0])
    llm = LLM(options.model, **engine_options)
    try:
        if llm.tokenizer is None:
            raise ValueError(f"model {options.model!r} has no tokenizer: pass --tokenizer")
        # The sequence cap never exceeds what the model's positions cover.
        max_seq_len = min(options.max_seq_len, llm.engine.info.arch.max_position_embeddings)
        kept, dropped = [], 0
        for prompt in prompts:
            ids = encode_chat_prompt(llm.tokenizer, prompt)
            if len(ids) + MIN_ANSWER_TOKENS > max_seq_len:
                dropped += 1
            else:
                kept.append(ids)
        if not kept:
            raise ValueError(f"max_seq_len {max_seq_len}: every prompt is longer than it allows")
        room = [min(options.max_new_tokens, max_seq_len - len(ids)) for ids in kept]
        sequences = []
        # One generate call per distinct answer budget keeps the batch large in the usual case
        # (the budget is max_new_tokens for all but the longest prompts).
        for budget in sorted(set(room), reverse=True):
            indices = [index for index, value in enumerate(room) if value == budget]
            answers = generate_answers(
                llm,
                [kept[index] for index in indices],
                budget,
                options.temperature,
                options.seed,
                options.show_progress,
            )
            sequences.extend(zip(indices, answers, strict=True))
        sequences.sort(key=lambda pair: pair[0])
        return [sequence for _, sequence in sequences], dropped, llm.tokenizer
    finally:
        del llm
        gc.collect()
