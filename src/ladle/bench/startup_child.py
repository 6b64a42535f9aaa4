"""The child process of `ladle bench startup` (offline mode): build LLM(...) as a user would, then
generate one token of one short prompt; print what it measured on one stdout line.

    python -m ladle.bench.startup_child --prompt-token-ids 1,2,3 [MODEL] [engine flags]

Its own clock starts at its first line (the interpreter's start and `import time` are before it,
and only the parent's clock sees them); the parent's clock stops when the result line arrives.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import argparse  # noqa: E402  (after the clock: the imports are part of the start-up)
import json  # noqa: E402
import sys  # noqa: E402

from ladle.cli.engine_args import add_engine_arguments, engine_options_from_args  # noqa: E402
from ladle.sampling.params import SamplingParams  # noqa: E402

RESULT_PREFIX = "LADLE_STARTUP_RESULT "


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ladle.bench.startup_child")
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--prompt-token-ids", required=True, help="comma-separated token ids")
    add_engine_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The engine (torch, ~1 s) loads in the child only: the parent (`ladle bench startup`, whose
    # parser `ladle serve --help` builds) imports this module for RESULT_PREFIX.
    from ladle.entrypoints.llm import LLM

    imported = time.perf_counter()
    llm = LLM(args.model, **engine_options_from_args(args))
    ready = time.perf_counter()
    prompt = [int(token) for token in args.prompt_token_ids.split(",")]
    outputs = llm.generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )
    done = time.perf_counter()
    result = {
        "imports_s": imported - STARTED,
        "llm_init_s": ready - imported,
        "generate_s": done - ready,
        "child_total_s": done - STARTED,
        "first_token_ids": list(outputs[0].outputs[0].token_ids),
        "first_text": outputs[0].outputs[0].text,
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
