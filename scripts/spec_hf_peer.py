"""Speculative decoding at batch 1 on the CPU, ladle against HF transformers' prompt lookup
(`generate(prompt_lookup_num_tokens=k)`), the default model (SmolLM2-135M-Instruct, its GGUF
dequantized to float32 for HF; ladle runs the same GGUF its default way) on the `edit` class.

Both engines are timed the same way, request by request: decode ms/token = (time to generate
N tokens - time to generate 1) / (N - 1), so the prompt's prefill is left out; greedy, each
request's own max_tokens, EOS on (both stop where the model ends). Each engine's runs with and
without drafting alternate request by request. One line per engine and mode, then the medians.

    python scripts/spec_hf_peer.py --num-requests 6 --k 4
"""

from __future__ import annotations

import argparse
import statistics
import time


def _decode_ms_per_token(generate, prompt, max_tokens: int) -> tuple[float, int]:
    started = time.perf_counter()
    generate(prompt, 1)
    one = time.perf_counter() - started
    started = time.perf_counter()
    produced = generate(prompt, max_tokens)
    many = time.perf_counter() - started
    return (many - one) * 1000 / max(1, produced - 1), produced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=6)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step, both engines")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ladle import LLM, SamplingParams
    from ladle.bench.edit_workload import edit_conversations
    from ladle.bench.serve_workloads import edit_texts
    from ladle.model.default_model import GGUF_FILENAME, resolve_default_model

    gguf = resolve_default_model()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=GGUF_FILENAME)
    requests = edit_conversations(
        edit_texts(tokenizer, args.num_requests, seed=0), tokenizer.encode
    )
    prompts = [
        tokenizer.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=True)
        for r in requests
    ]
    prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]

    hf = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=GGUF_FILENAME, dtype=torch.float32
    ).eval()

    def hf_generate(lookup: int | None):
        def run(prompt, max_tokens):
            ids = torch.tensor([prompt])
            options = dict(max_new_tokens=max_tokens, do_sample=False)
            if lookup:
                options["prompt_lookup_num_tokens"] = lookup
            with torch.no_grad():
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), **options)
            return out.shape[1] - ids.shape[1]

        return run

    plain = LLM(max_num_seqs=1)
    drafting = LLM(
        max_num_seqs=1,
        speculative_config={"method": "ngram", "num_speculative_tokens": args.k},
    )

    def ladle_generate(llm):
        def run(prompt, max_tokens):
            params = SamplingParams(temperature=0, max_tokens=max_tokens)
            (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
            return len(out.outputs[0].token_ids)

        return run

    modes = {
        "hf": hf_generate(None),
        f"hf prompt lookup k={args.k}": hf_generate(args.k),
        "ladle": ladle_generate(plain),
        f"ladle ngram k={args.k}": ladle_generate(drafting),
    }
    results: dict[str, list[float]] = {name: [] for name in modes}
    for prompt, request in zip(prompts, requests):
        for name, generate in modes.items():
            ms, produced = _decode_ms_per_token(generate, prompt, request.max_tokens)
            results[name].append(ms)
            print(f"{request.kind:9s} {name:24s} {produced:4d} tokens {ms:7.2f} ms/token",
                  flush=True)
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, value in medians.items():
        print(f"median {name:24s} {value:7.2f} ms/token")
    print(f"speed-up hf {medians['hf'] / medians[f'hf prompt lookup k={args.k}']:.2f}x, "
          f"ladle {medians['ladle'] / medians[f'ladle ngram k={args.k}']:.2f}x; "
          f"ladle ngram vs hf prompt lookup "
          f"{medians[f'hf prompt lookup k={args.k}'] / medians[f'ladle ngram k={args.k}']:.2f}x")


if __name__ == "__main__":
    main()
