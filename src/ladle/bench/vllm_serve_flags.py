"""`vllm bench serve`'s flag spellings for `ladle bench serve`, so its usual command line runs:

    ladle bench serve --backend vllm --host 127.0.0.1 --port 8000 --model M \\
        --endpoint /v1/completions --dataset-name random --random-input-len 128 \\
        --random-output-len 64 --num-prompts 50 --request-rate inf --ignore-eos

They map onto ladle's own flags (apply_vllm_spellings); what has no ladle meaning is refused
naming the flag, never dropped.
"""

from __future__ import annotations

import argparse

# vLLM's dataset names -> ladle's workload classes (bench/serve_workloads.py).
DATASETS = {"random": "token-ids", "sharegpt": "sharegpt"}
# vLLM's backends that speak the OpenAI API ladle serves (completions or chat completions).
BACKENDS = ("vllm", "openai", "openai-chat")
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def add_vllm_spellings(parser: argparse.ArgumentParser) -> None:
    """The flags, in a group of their own; ladle's spelling of each is in its help."""
    group = parser.add_argument_group("vLLM's spellings (vllm bench serve)")
    # Aliases: SUPPRESS leaves ladle's flag's default in place when they are not given.
    group.add_argument("--request-rate", dest="rate", default=argparse.SUPPRESS, help="--rate")
    group.add_argument("--host", default=None, help="with --port: --base-url http://HOST:PORT")
    group.add_argument("--port", type=int, default=None, help="see --host")
    group.add_argument("--backend", choices=BACKENDS, default=None,
                       help="accepted: ladle speaks the OpenAI API to every server")
    group.add_argument("--endpoint", choices=ENDPOINTS, default=None,
                       help="accepted: each workload class sends the route it is made of "
                       "(random: completions)")
    group.add_argument("--dataset-name", choices=sorted(DATASETS), default=None,
                       help="random: --workload token-ids; sharegpt: --workload sharegpt")
    group.add_argument("--dataset-path", dest="sharegpt_path", default=argparse.SUPPRESS,
                       help="--sharegpt-path")
    group.add_argument("--random-input-len", type=int, default=None,
                       help="--input-len N:N (with --dataset-name random)")
    group.add_argument("--random-output-len", type=int, default=None,
                       help="--output-len N:N (with --dataset-name random)")
    group.add_argument("--result-dir", dest="output_dir", default=argparse.SUPPRESS,
                       help="--output-dir")
    group.add_argument("--save-result", action="store_true",
                       help="accepted: results.json is always written")


def apply_vllm_spellings(args: argparse.Namespace) -> None:
    """Set ladle's flags from vLLM's, in place; ValueError naming a flag that cannot apply."""
    if args.host is not None or args.port is not None:
        host = args.host or "127.0.0.1"
        args.base_url = f"http://{host}:{args.port or 8000}"
    if args.dataset_name is not None:
        args.workload = DATASETS[args.dataset_name]
    for flag, value, target in (
        ("--random-input-len", args.random_input_len, "input_len"),
        ("--random-output-len", args.random_output_len, "output_len"),
    ):
        if value is None:
            continue
        if args.workload != "token-ids":
            raise ValueError(f"{flag} sizes the random dataset: add --dataset-name random")
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
        setattr(args, target, f"{value}:{value}")
