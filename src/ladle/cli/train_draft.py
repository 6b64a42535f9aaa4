"""`ladle train-draft MODEL OUT`: train an EAGLE-3 draft head for MODEL from its own answers to
ShareGPT prompts (or --prompts-file) and write OUT in the layout vLLM and SGLang load, which
`--speculative-config '{"method": "eagle3", "model": OUT}'` names. The work is in
spec_decode/train/ (pipeline.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_train_draft_parser(subparsers: argparse._SubParsersAction) -> None:
    sub = subparsers.add_parser(
        "train-draft",
        help="train an EAGLE-3 draft head for speculative decoding",
        description="Generate MODEL's answers to prompts (greedy by default), collect its hidden "
        "states, train an EAGLE-3 head with the training-time test, report its acceptance "
        "length on held-out prompts and write OUT (config.json + model.safetensors, vLLM's "
        "LlamaForCausalLMEagle3 layout). See docs/speculative_decoding.md.",
    )
    sub.add_argument(
        "model",
        nargs="?",
        default=None,
        help="HF folder, .gguf file or preset (with --load-format dummy); default: SmolLM2-135M",
    )
    sub.add_argument("out", help="output folder (created; must be empty unless --overwrite)")
    sub.add_argument("--num-prompts", type=int, default=512, help="training prompts")
    sub.add_argument(
        "--held-out",
        type=int,
        default=32,
        help="further prompts kept out of training, on "
        "which the acceptance length is measured (0: none)",
    )
    sub.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap")
    sub.add_argument(
        "--temperature", type=float, default=0.0, help="answers' temperature (0: greedy)"
    )
    sub.add_argument("--epochs", type=int, default=2)
    sub.add_argument("--lr", type=float, default=3e-4, help="AdamW peak learning rate")
    sub.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    sub.add_argument(
        "--max-seq-len",
        type=int,
        default=1024,
        help="prompt + answer tokens; longer prompts are dropped",
    )
    sub.add_argument(
        "--ttt-steps",
        type=int,
        default=5,
        help="draft steps unrolled per training position (EAGLE-3's training-time test)",
    )
    sub.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        help="tokens the head drafts (the answers' most frequent); default min(vocab, 32000)",
    )
    sub.add_argument(
        "--num-speculative-tokens", type=int, default=4, help="k of the held-out measurement"
    )
    sub.add_argument(
        "--aux-layer-ids",
        default=None,
        help="three comma-separated target layers to fuse "
        "(vLLM's ids: the stream entering layer i); default 2,L/2,L-3",
    )
    sub.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    sub.add_argument("--seed", type=int, default=0)
    sub.add_argument(
        "--prompts-file",
        default=None,
        help='JSONL prompts (a string or {"prompt": ...} a line) instead of ShareGPT',
    )
    sub.add_argument(
        "--load-format",
        default="auto",
        choices=["auto", "dummy", "gguf", "safetensors"],
        help="dummy: random weights of a preset (shape tests)",
    )
    sub.add_argument("--tokenizer", default=None, help="tokenizer, if not the model's")
    sub.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    sub.add_argument(
        "--train-threads",
        type=int,
        default=None,
        help="CPU threads for the feature pass and training (default: torch's); 1 is much "
        "faster on a CPU busy with other work",
    )
    sub.add_argument(
        "--teacher-forced",
        type=int,
        default=None,
        help="ShareGPT conversations added to the training data as they are (the target reads "
        "their text, no answer is generated; every position is a label): about a third of a "
        "generated answer's cost a token. Default: --num-prompts when the prompts come from "
        "ShareGPT, else 0",
    )
    sub.add_argument(
        "--vocab-conversations",
        type=int,
        default=None,
        help="ShareGPT conversations whose token counts join the answers' to choose the draft "
        "vocabulary (only tokenized: seconds). Default: 2000 when the prompts come from "
        "ShareGPT, else 0",
    )
    sub.add_argument(
        "--no-label-prompts",
        dest="label_prompts",
        action="store_false",
        help="train on the answers' positions only (default: the prompts' too)",
    )
    sub.add_argument(
        "--train-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="the training step's autocast; auto: bfloat16 on CUDA and on CPUs with native "
        "bfloat16 (AVX-512 BF16, AMX), else float32",
    )
    sub.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="also measure the held-out acceptance every N training steps (a curve in "
        "training_summary.json; 0: at the end only)",
    )
    sub.add_argument("--overwrite", action="store_true", help="write into a non-empty OUT")
    sub.set_defaults(handler=run_train_draft)


def parse_layer_ids(text: str | None) -> tuple[int, int, int] | None:
    if text is None:
        return None
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"aux_layer_ids {text!r} is not three comma-separated integers") from None
    if len(ids) != 3:
        raise ValueError(f"aux_layer_ids {text!r} must name three layers")
    return ids


def run_train_draft(args: argparse.Namespace) -> int:
    # The training pipeline imports torch (~1 s): `ladle serve --help` builds this parser.
    from ladle.spec_decode.train.pipeline import TrainDraftOptions, train_draft

    options = TrainDraftOptions(
        model=args.model,
        out=Path(args.out),
        num_prompts=args.num_prompts,
        held_out=args.held_out,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        max_seq_len=args.max_seq_len,
        ttt_steps=args.ttt_steps,
        draft_vocab_size=args.draft_vocab_size,
        num_speculative_tokens=args.num_speculative_tokens,
        aux_layer_ids=parse_layer_ids(args.aux_layer_ids),
        device=args.device,
        seed=args.seed,
        load_format=args.load_format,
        tokenizer=args.tokenizer,
        prompts_file=args.prompts_file,
        save_dtype=args.save_dtype,
        train_threads=args.train_threads,
        teacher_forced=args.teacher_forced,
        vocab_conversations=args.vocab_conversations,
        label_prompts=args.label_prompts,
        train_dtype=args.train_dtype,
        eval_every=args.eval_every,
        overwrite=args.overwrite,
    )
    summary = train_draft(options)
    brief = {key: summary[key] for key in ("out", "num_steps", "first_loss", "last_loss")}
    brief["seconds"] = summary["seconds"]
    brief["held_out_acceptance"] = summary["held_out_acceptance"]
    brief["held_out_vocab_coverage"] = summary["held_out_vocab_coverage"]
    print(json.dumps(brief, indent=2))
    return 0
