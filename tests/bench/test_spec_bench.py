"""`ladle bench latency` with speculation: the synthetic-acceptance mode, the report of the same
run without speculation, and the edit workload's requests."""

from __future__ import annotations

import json

import pytest

from ladle.cli.main import build_parser


def _bench(tmp_path, *flags: str) -> dict:
    from ladle.bench.engine_bench import run_bench

    path = tmp_path / "result.json"
    args = build_parser().parse_args(
        ["bench", "latency", "--model", "tiny-llama", "--load-format", "dummy",
         "--input-len", "32", "32", "--output-len", "48", "48", "--num-requests", "1",
         "--runs", "1", "--no-busy", "--no-progress", "--json", str(path), *flags]
    )
    assert run_bench(args) == 0
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    "overlap", [[], ["--async-scheduling", "--num-requests", "4"]], ids=["sync", "overlapped"]
)
def test_synthetic_acceptance_accepts_drafts_at_the_given_rate(tmp_path, overlap):
    """Random ids have nothing to look up; with synthetic acceptance every step still drafts k
    and each draft is accepted with probability A until the first refusal, so accepted per
    drafted token is (A + A^2 + ... + A^k) / k = A(1 - A^k) / (k(1 - A)). Overlapped, the coin
    is drawn on the device (worker/drafts_on_device.py) and the baseline sets it aside."""
    config = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False,
              "drafts_on_device": bool(overlap)}
    result = _bench(tmp_path, "--speculative-config", json.dumps(config),
                    "--synthetic-acceptance", "0.7", *overlap)
    speculation = result["speculation"]
    k, rate = 4, 0.7
    expected_accepted_per_draft = rate * (1 - rate**k) / (k * (1 - rate))
    assert speculation["num_drafts"] >= 10
    assert speculation["acceptance_rate"] == pytest.approx(expected_accepted_per_draft, abs=0.15)
    assert speculation["acceptance_length"] > 1.5
    assert speculation["no_spec_tokens_per_s"] > 0 and speculation["speedup_tokens_per_s"] > 0
    # The requests still end at max_tokens.
    assert result["generated_tokens"] == 48 * (4 if overlap else 1)


def test_synthetic_acceptance_needs_a_speculative_config(tmp_path):
    with pytest.raises(ValueError, match="--synthetic-acceptance needs --speculative-config"):
        _bench(tmp_path, "--synthetic-acceptance", "0.5")


def test_edit_requests_quote_the_text_they_ask_to_change():
    from ladle.bench.edit_workload import INSTRUCTIONS, edit_conversations

    texts = ["alpha beta gamma " * 10, "one two three " * 20, "x y z " * 30]
    requests = edit_conversations(texts, str.split)
    assert [r.kind for r in requests] == [kind for kind, _, _ in INSTRUCTIONS]
    for request, text in zip(requests, texts):
        assert request.messages[0]["content"].endswith(text)
        assert request.text_tokens == len(text.split())
    assert requests[0].max_tokens > requests[0].text_tokens  # a rewrite may run a bit longer
    assert requests[2].max_tokens < requests[2].text_tokens  # a summary is shorter


def test_the_edit_class_quotes_sharegpt_replies_of_the_lengths(tmp_path):
    from ladle.bench.serve_workloads import WorkloadOptions, build_workload

    class Words:
        def encode(self, text):
            return text.split()

        def decode(self, ids):
            return " ".join(ids)

    replies = [" ".join(f"w{i}" for i in range(n)) for n in (10, 80, 200, 500, 120)]
    entries = [
        {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": reply}]}
        for reply in replies
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries))
    options = WorkloadOptions(num_requests=3, tokenizer=Words(), sharegpt_path=str(path))
    requests = build_workload({"edit": 1}, options)
    quoted = sorted(
        next(len(r.split()) for r in replies if request.messages[0]["content"].endswith(r))
        for request in requests
    )
    assert quoted == [80, 120, 200]  # 10 and 500 tokens are outside 64..400
    assert all(request.workload == "edit" for request in requests)
    options.num_requests = 4
    with pytest.raises(ValueError, match="only 3 replies"):
        build_workload({"edit": 1}, options)
