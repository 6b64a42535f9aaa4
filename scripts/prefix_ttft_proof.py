"""The prefix-caching TTFT proof of issue 9 alone: TTFT p50 with caching on vs off.

    python scripts/prefix_ttft_proof.py --out OUT [--deadline-s 200] [--pair caching]
        [--model llama-3.1-8b --rate 16 --num 64]

The same servers, workload and runs as the prefix part of `serve_proofs.py --phase scheduler`
(server a: chunked prefill, 512-token step budget, caching on; server b: no chunking, no
caching; `ladle bench serve --workload shared-prefix`, 32 requests at 8/s, seed 3), each after a
shorter warm-up, without that phase's other runs. Writes prefix_proof.json under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_proofs import SMOKE, Deadline, Runner, _start, _stop, figure, ladle_server  # noqa: E402

# --pair scheduler: the servers of serve_proofs' scheduler phase (they differ in chunking too).
# --pair caching: the server's defaults, with and without prefix caching: caching alone.
PAIRS = {
    "scheduler": {
        "on": ["--max-num-batched-tokens", "512"],
        "off": ["--no-chunked-prefill", "--no-prefix-caching", "--max-num-batched-tokens", "8448"],
    },
    "caching": {"on": [], "off": ["--no-prefix-caching"]},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--num", type=int, default=32)
    parser.add_argument("--rate", default="8")
    parser.add_argument("--deadline-s", type=float, default=None)
    parser.add_argument("--warmup-num", default="24", help="warm-up requests per rate")
    parser.add_argument("--servers", default="on,off", help="which servers to run: on, off")
    parser.add_argument("--pair", choices=sorted(PAIRS), default="scheduler")
    parser.add_argument("--max-num-seqs", default="32")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = Deadline(args.deadline_s)
    runner = Runner(out, deadline, ["--token-ids", "--ignore-eos"])
    common = ["--load-format", "dummy", "--max-num-seqs", args.max_num_seqs]
    fixed = ["--num-prompts", str(args.num), "--rate", args.rate]
    warm = ["--num-prompts", args.warmup_num, "--sweep", "16,inf", "--no-plots", "--seed", "1000"]
    results = {}
    for name in args.servers.split(","):
        server_args = PAIRS[args.pair][name]
        server = _start(
            lambda timeout, server_args=server_args, name=name: ladle_server(
                args.model, [*common, *server_args], out / f"server_{name}.log", timeout
            ),
            deadline,
            60,
            runner.skipped,
            name,
        )
        try:
            runner.bench(server, f"warmup_{name}", 25, "--workload", "shared-prefix", *warm)
            results[name] = runner.bench(
                server, f"prefix_{name}", 25, "--seed", "3", "--workload", "shared-prefix", *fixed
            )
        finally:
            _stop(server)
    on, off = (
        figure(results.get("on", {}), "ttft", "p50"),
        figure(results.get("off", {}), "ttft", "p50"),
    )
    summary = {
        "ttft_p50_on_ms": on,
        "ttft_p50_off_ms": off,
        "ratio": off / on if on and off else None,
        "ttft_p90_on_ms": figure(results.get("on", {}), "ttft", "p90"),
        "ttft_p90_off_ms": figure(results.get("off", {}), "ttft", "p90"),
        "pair": args.pair,
        "model": args.model,
        "rate": args.rate,
        "num_prompts": args.num,
        "skipped": runner.skipped,
    }
    (out / "prefix_proof.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    assert SMOKE  # the proof runs with serve_proofs' defaults (no smoke options)
    sys.exit(main())
