"""Time `ladle train-draft`'s training step for an EAGLE-3 head of a large target's shape on one
GPU (issue 33: the time per training step on the 8B shape).

The target is a preset with random weights (--load-format dummy: only its embedding and LM head
are read by the step); the features are random tensors of the real shapes, the tokens random
ids, so no data set is needed on the device. The timed function is trainer.train_step, the one
`ladle train-draft` runs. Prints one JSON object.

    python scripts/train_draft_gpu.py --model llama-3.1-8b --batch-size 2 --seq-len 2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ladle.spec_decode.train.eagle3_head import Eagle3Head, Eagle3HeadConfig
from ladle.spec_decode.train.features import SequenceFeatures, load_target
from ladle.spec_decode.train.trainer import make_batch, make_optimizer, train_step


def time_training_steps(
    model: str,
    batch_size: int,
    seq_len: int,
    ttt_steps: int,
    draft_vocab_size: int,
    steps: int,
    warmup: int,
    seed: int = 0,
    device_name: str = "cuda",
) -> dict:
    """Median seconds of `train_step` over `steps` steps after `warmup`, and what it ran on."""
    device = torch.device(device_name)
    on_cuda = device.type == "cuda"
    dtype = torch.bfloat16 if on_cuda else torch.float32
    target = load_target(model, device, dtype, load_format="dummy", seed=seed)
    arch = target.arch
    generator = torch.Generator(device="cpu").manual_seed(seed)
    draft_ids = (
        torch.randperm(arch.vocab_size, generator=generator)[:draft_vocab_size].sort().values
    )
    config = Eagle3HeadConfig.from_target(arch, draft_vocab_size)
    head = Eagle3Head(config, draft_ids).to(device)
    optimizer = make_optimizer(head, 1e-4)
    items = []
    for _ in range(batch_size):
        tokens = torch.randint(0, arch.vocab_size, (seq_len,), generator=generator)
        items.append(
            SequenceFeatures(
                token_ids=tokens.to(device),
                prompt_length=seq_len // 4,
                aux_hidden=torch.randn(seq_len, 3 * arch.hidden_size, device=device, dtype=dtype),
                final_hidden=torch.randn(seq_len, arch.hidden_size, device=device, dtype=dtype),
                target_argmax=draft_ids[
                    torch.randint(0, draft_vocab_size, (seq_len,), generator=generator)
                ].to(device),
            )
        )
    batch = make_batch(items, head.t2d, device)
    rows = target.lm_head_weight[head.draft_token_ids]
    synchronize = torch.cuda.synchronize if on_cuda else (lambda: None)
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    durations = []
    for index in range(warmup + steps):
        synchronize()
        started = time.perf_counter()
        result = train_step(head, optimizer, batch, target.embedding, rows, ttt_steps)
        synchronize()
        if index >= warmup:
            durations.append(time.perf_counter() - started)
    median = statistics.median(durations)
    return {
        "model": model,
        "device": torch.cuda.get_device_name() if on_cuda else "cpu",
        "batch_size": batch_size,
        "seq_len": seq_len,
        "ttt_steps": ttt_steps,
        "draft_vocab_size": draft_vocab_size,
        "head_parameters": sum(p.numel() for p in head.parameters()),
        "median_step_s": round(median, 4),
        "min_step_s": round(min(durations), 4),
        "tokens_per_s": round(batch_size * seq_len / median, 1),
        "peak_memory_gib": (
            round(torch.cuda.max_memory_allocated() / 2**30, 2) if on_cuda else None
        ),
        "last_loss": result.loss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--ttt-steps", type=int, default=5)
    parser.add_argument("--draft-vocab-size", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("train_draft_gpu.py: CUDA is not available (--device cpu to smoke-test)")
    print(
        json.dumps(
            time_training_steps(
                args.model,
                args.batch_size,
                args.seq_len,
                args.ttt_steps,
                args.draft_vocab_size,
                args.steps,
                args.warmup,
                device_name=args.device,
            ),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
