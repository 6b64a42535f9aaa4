"""Greedy-token agreement of a quantized default model with float32 over 32 chat prompts.

    PYTHONPATH=... python benchmarks/greedy_agreement.py --quantization int8 --max-tokens 32
    PYTHONPATH=... python benchmarks/greedy_agreement.py --model QUANTIZED_FOLDER

(--model: a quantized checkpoint of the default model, e.g. `ladle quantize` output, served as
written; the reference is always the default model in float32.)

Agreement: the fraction of generated positions, over all prompts, before which both runs produced
identical tokens and at which they agree (a prompt stops counting at its first divergence, since
the continuations differ after it); also the number of prompts identical throughout.
"""

from __future__ import annotations

import argparse

from ladle import LLM, SamplingParams

TOPICS = [
    "the water cycle", "how vaccines work", "the French revolution", "black holes",
    "photosynthesis", "the stock market", "machine learning", "climate change",
    "the Roman empire", "plate tectonics", "the internet", "quantum computing",
    "healthy sleep", "the printing press", "electric cars", "honey bees",
    "volcanoes", "the moon landing", "recycling", "the human heart",
    "jazz music", "coffee", "the Great Wall of China", "solar panels",
    "chess openings", "rainbows", "the immune system", "bread baking",
    "ocean tides", "the Olympic games", "dinosaurs", "time zones",
]  # fmt: skip


def generate(llm: LLM, max_tokens: int) -> list[list[int]]:
    messages = [
        [{"role": "user", "content": f"Explain {topic} in a few sentences."}] for topic in TOPICS
    ]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = llm.chat(messages, params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantization", default="int8")
    parser.add_argument("--model", default=None, help="candidate model (default: the default)")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    reference = generate(LLM(quantization="none", dtype="float32"), args.max_tokens)
    if args.model is not None:
        candidate_llm = LLM(model=args.model, quantization="auto")
    else:
        candidate_llm = LLM(quantization=args.quantization)
    candidate = generate(candidate_llm, args.max_tokens)
    agreed, identical = 0, 0
    for ref, cand in zip(reference, candidate, strict=True):
        prefix = next((i for i, (a, b) in enumerate(zip(ref, cand)) if a != b), len(ref))
        agreed += prefix
        identical += prefix == len(ref)
    total = sum(map(len, reference))
    print(
        f"{args.model or args.quantization} vs float32: {agreed}/{total} greedy tokens agree "
        f"before the first divergence ({agreed / total:.1%}); {identical}/{len(TOPICS)} "
        "prompts identical"
    )


if __name__ == "__main__":
    main()
