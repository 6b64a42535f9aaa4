"""`ladle bench multiturn`: conversations that come back with their whole history plus a new
turn, the workload of the KV cache's host tier (core/host_tier.py).

    ladle bench multiturn --working-set 3.5 --num-gpu-blocks-override 2049   # 0.6B shape
    ladle bench multiturn --working-set 3.5 --compare-tier-off --json out.json  # same run, off

Seeded: conversation i's turns (random token ids) and reply lengths come from one
random.Random(seed), in order. The default recipe is multi-round QA over a long context (the
regime LMCache's and vLLM's multi-turn benchmarks measure): a first turn of 2,000-4,000 tokens
(a document, a code file, an agent's context), then short questions (50-200 tokens) with short
answers (32-128 tokens); --first-turn-len / --turn-len / --reply-len change it.

The client is a closed loop of --concurrency users: the queue holds every conversation's turn 1,
then every turn 2, and so on; a user takes the next turn whose conversation is not still waiting
for its previous reply, sends its whole history (every earlier turn and the model's actual
replies, EOS ignored) plus the new turn, and waits for the reply. So between two turns of one
conversation every other conversation runs a turn: with a working set (the tokens of every
conversation's final history) larger than the device pool, a history has been evicted from the
device by the time it comes back, and only a host tier still has it. Keep concurrency x the
longest history below the device pool, or preemptions (not the tier) decide the result.

--working-set X picks the number of conversations so that the working set is X times the device
pool's tokens (after start-up sizes the pool; --num-gpu-blocks-override shrinks it honestly).

Reported, over the timed conversations: generated tok/s over the wall time, TTFT p50 / p90 (from
the moment each request is sent), and which tier served the prompt tokens: device hits, host
hits (loaded back), computed. --compare-tier-off runs the same conversations again in the same
process with the host tier off (--kv-offloading-size 0) and prints the ratios.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import random
import sys
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from ladle.cli.engine_args import add_engine_arguments, engine_options_from_args
from ladle.protocol.messages import EngineCoreRequest
from ladle.sampling.params import SamplingParams


@dataclass(frozen=True)
class MultiturnWorkload:
    """A seeded recipe of conversations: turn and reply lengths, ids, sampling."""

    num_turns: int = 4
    first_turn_len: tuple[int, int] = (2000, 4000)  # the context the conversation opens with
    turn_len: tuple[int, int] = (50, 200)  # new tokens each later turn adds
    reply_len: tuple[int, int] = (32, 128)  # tokens the model generates per turn
    max_token_id: int = 10000
    temperature: float = 0.0
    seed: int = 0
    concurrency: int = 6  # users in the closed loop: requests in flight at most

    def __post_init__(self) -> None:
        if self.num_turns < 1:
            raise ValueError(f"num_turns must be >= 1, got {self.num_turns}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        for name in ("first_turn_len", "turn_len", "reply_len"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be 1 <= min <= max, got {low}, {high}")


@dataclass
class Conversation:
    turns: list[list[int]]  # the ids each turn adds
    reply_lens: list[int]
    history: list[int] = field(default_factory=list)  # turns and replies so far

    @property
    def num_working_set_tokens(self) -> int:
        """Tokens of its final history (every turn and reply): what a cache would keep."""
        return sum(map(len, self.turns)) + sum(self.reply_lens)


def build_conversations(workload: MultiturnWorkload, count: int) -> list[Conversation]:
    """The first `count` conversations of the workload (a prefix of any longer list)."""
    return list(itertools.islice(_conversations(workload), count))


def _conversations(workload: MultiturnWorkload) -> Iterator[Conversation]:
    rng = random.Random(workload.seed)
    while True:
        turns, reply_lens = [], []
        for turn in range(workload.num_turns):
            length = rng.randint(*(workload.first_turn_len if turn == 0 else workload.turn_len))
            turns.append([rng.randint(0, workload.max_token_id) for _ in range(length)])
            reply_lens.append(rng.randint(*workload.reply_len))
        yield Conversation(turns, reply_lens)


def conversations_for_working_set(
    workload: MultiturnWorkload, pool_tokens: int, multiple: float, limit: int = 100_000
) -> list[Conversation]:
    """Conversations, in order, until their working set reaches multiple x pool_tokens."""
    if multiple <= 0 or pool_tokens <= 0:
        raise ValueError(f"working set multiple and pool tokens must be > 0, got {multiple}, "
                         f"{pool_tokens}")
    target = multiple * pool_tokens
    conversations, total = [], 0
    for conversation in itertools.islice(_conversations(workload), limit):
        conversations.append(conversation)
        total += conversation.num_working_set_tokens
        if total >= target:
            break
    return conversations


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def run_multiturn(engine, conversations: list[Conversation], workload: MultiturnWorkload,
                  tag: str = "mt") -> dict:
    """The closed loop of workload.concurrency users through EngineCore.step; the
    conversations' histories grow in place."""
    for conversation in conversations:
        conversation.history = []
    vocab = engine.vocab_size
    before = engine.get_stats()
    ttfts: list[float] = []
    num_generated = num_prompt = num_cached = 0
    queue = deque(
        (turn, index) for turn in range(workload.num_turns) for index in range(len(conversations))
    )
    # request id -> (conversation index, time sent, reply so far)
    in_flight: dict[str, tuple[int, float, list[int]]] = {}
    max_in_flight = 0
    started = time.perf_counter()
    while queue or in_flight:
        busy = {index for index, _, _ in in_flight.values()}
        while queue and len(in_flight) < workload.concurrency and queue[0][1] not in busy:
            turn, index = queue.popleft()
            conversation = conversations[index]
            prompt = conversation.history + [t % vocab for t in conversation.turns[turn]]
            conversation.history = prompt
            num_prompt += len(prompt)
            request_id = f"{tag}-{turn}-{index}"
            engine.add_request(EngineCoreRequest(
                request_id=request_id,
                prompt_token_ids=prompt,
                sampling_params=SamplingParams(
                    temperature=workload.temperature,
                    max_tokens=conversation.reply_lens[turn],
                    ignore_eos=True,
                    seed=index,
                ),
            ))
            in_flight[request_id] = (index, time.perf_counter(), [])
            busy.add(index)
        max_in_flight = max(max_in_flight, len(in_flight))
        for output in engine.step():
            index, sent, reply = in_flight[output.request_id]
            if output.new_token_ids and not reply:
                ttfts.append(time.perf_counter() - sent)
                num_cached += output.num_cached_tokens
            reply.extend(output.new_token_ids)
            if output.finished:
                del in_flight[output.request_id]
                conversations[index].history = conversations[index].history + reply
                num_generated += len(reply)
    seconds = time.perf_counter() - started
    after = engine.get_stats()
    num_host_hit = after.host_cache_hits - before.host_cache_hits
    return {
        "num_conversations": len(conversations),
        "num_requests": len(conversations) * workload.num_turns,
        "seconds": seconds,
        "max_in_flight": max_in_flight,
        "generated_tokens": num_generated,
        "tokens_per_s": num_generated / seconds,
        "ttft_ms_p50": _ms(_percentile(ttfts, 50)),
        "ttft_ms_p90": _ms(_percentile(ttfts, 90)),
        "prompt_tokens": num_prompt,
        # Shares of the prompt tokens: cached when first scheduled (device or host), computed
        # then; of the cached, loaded from the host (a load after a preemption counts here
        # too, so with preemptions device + host can exceed the cached share slightly).
        "cached_rate": num_cached / num_prompt,
        "device_hit_rate": max(0, num_cached - num_host_hit) / num_prompt,
        "host_hit_rate": num_host_hit / num_prompt,
        "computed_rate": 1 - num_cached / num_prompt,
        "bytes_to_host": after.kv_bytes_to_host - before.kv_bytes_to_host,
        "bytes_to_device": after.kv_bytes_to_device - before.kv_bytes_to_device,
        "copy_seconds": after.kv_copy_seconds - before.kv_copy_seconds,
        "load_seconds": after.kv_load_seconds - before.kv_load_seconds,
        "preemptions": after.num_preemptions - before.num_preemptions,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _run_one(model: str, options: dict, workload: MultiturnWorkload, multiple: float,
             conversations: list[Conversation] | None) -> tuple[dict, list[Conversation]]:
    # The engine and torch (~1 s) load to run, not for `ladle serve --help`.
    import torch

    from ladle import LLM

    llm = LLM(model, **options)
    engine = llm.engine
    budget = engine.info.memory_budget
    if conversations is None:
        conversations = conversations_for_working_set(workload, budget.num_token_slots, multiple)
    # Kernel builds and first-use costs outside the timing: two short conversations.
    run_multiturn(engine, build_conversations(workload, 2)[:2], workload, tag="warm-up")
    engine.kv_cache_manager.reset_prefix_cache()
    result = run_multiturn(engine, conversations, workload)
    load_seconds = result["load_seconds"]
    result.update(
        # The loads' bandwidth (device time of their copies) against the start-up probe's.
        load_gb_per_s=result["bytes_to_device"] / load_seconds / 1e9 if load_seconds else None,
        device_pool_tokens=budget.num_token_slots,
        host_tier_tokens=budget.num_host_token_slots,
        working_set_tokens=sum(c.num_working_set_tokens for c in conversations),
        copy_gb_per_s=budget.copy_bytes_per_s / 1e9,
        budget=budget.describe(),
    )
    device = engine.executor.info.device_type
    del engine, llm
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result, conversations


def run_bench_multiturn(args: argparse.Namespace) -> int:
    workload = MultiturnWorkload(
        num_turns=args.turns,
        first_turn_len=tuple(args.first_turn_len),
        turn_len=tuple(args.turn_len),
        reply_len=tuple(args.reply_len),
        temperature=args.temperature,
        seed=args.workload_seed,
        concurrency=args.concurrency,
    )
    options = engine_options_from_args(args)
    model = args.model or "qwen3-0.6b"
    if args.model is None:
        options["load_format"] = "dummy"
    result, conversations = _run_one(model, options, workload, args.working_set, None)
    report = {"model": model, "workload": workload.__dict__, "tier": result}
    if args.compare_tier_off:
        off, _ = _run_one(model, {**options, "kv_offloading_size": 0}, workload,
                          args.working_set, conversations)
        report["tier_off"] = off
        report["ttft_p50_ratio_off_over_on"] = _ratio(off["ttft_ms_p50"], result["ttft_ms_p50"])
        report["throughput_ratio_on_over_off"] = _ratio(result["tokens_per_s"],
                                                        off["tokens_per_s"])
    _print(report)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1, default=str)
    return 0


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _print(report: dict) -> None:
    for name in ("tier", "tier_off"):
        run = report.get(name)
        if run is None:
            continue
        print(f"[{name}] {run['budget']}")
        print(
            f"[{name}] {run['num_conversations']} conversations x {report['workload']['num_turns']}"
            f" turns, working set {run['working_set_tokens']:,} tokens "
            f"({run['working_set_tokens'] / run['device_pool_tokens']:.2f}x the device pool), "
            f"{report['workload']['concurrency']} in flight: "
            f"{run['tokens_per_s']:,.0f} tok/s, TTFT p50 {run['ttft_ms_p50']:.1f} ms "
            f"p90 {run['ttft_ms_p90']:.1f} ms; prompt tokens from device "
            f"{run['device_hit_rate']:.1%}, host {run['host_hit_rate']:.1%}, computed "
            f"{run['computed_rate']:.1%}; {run['bytes_to_device'] / 1e9:.2f} GB loaded, "
            f"{run['bytes_to_host'] / 1e9:.2f} GB written back; loads at "
            f"{_fmt(run['load_gb_per_s'])} GB/s (probe {run['copy_gb_per_s']:.1f}); "
            f"{run['preemptions']} preemptions"
        )
    if "tier_off" in report:
        print(f"TTFT p50 off/on {report['ttft_p50_ratio_off_over_on']:.2f}x, "
              f"throughput on/off {report['throughput_ratio_on_over_off']:.2f}x")
    sys.stdout.flush()


def add_bench_multiturn_parser(commands) -> None:
    help_text = "multi-turn conversations that return with their history (the KV host tier)"
    sub = commands.add_parser("multiturn", help=help_text, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub.add_argument("--model", default=None, help="default: qwen3-0.6b's shape, dummy weights")
    sub.add_argument("--working-set", type=float, default=3.5,
                     help="the conversations' tokens as a multiple of the device pool's")
    sub.add_argument("--turns", type=int, default=4)
    sub.add_argument("--first-turn-len", type=int, nargs=2, default=[2000, 4000],
                     metavar=("MIN", "MAX"), help="tokens of the context a conversation opens with")
    sub.add_argument("--turn-len", type=int, nargs=2, default=[50, 200], metavar=("MIN", "MAX"),
                     help="tokens each later turn adds")
    sub.add_argument("--reply-len", type=int, nargs=2, default=[32, 128], metavar=("MIN", "MAX"))
    sub.add_argument("--concurrency", type=int, default=6,
                     help="users in the closed loop (requests in flight at most)")
    sub.add_argument("--temperature", type=float, default=0.0)
    sub.add_argument("--workload-seed", type=int, default=0, help="the conversations' seed")
    sub.add_argument("--compare-tier-off", action="store_true",
                     help="run the same conversations again with the host tier off")
    sub.add_argument("--json", default=None, help="also write the results here")
    add_engine_arguments(sub)
    sub.set_defaults(handler=run_bench_multiturn)
