"""vLLM's `bench latency|throughput|serve` spellings in `ladle bench`: one-length --input-len /
--output-len, --batch-size / --num-prompts / --num-iters / --output-json, and bench serve's
--host/--port, --dataset-name random with --random-input-len/--random-output-len,
--request-rate, --result-dir; a vLLM latency command line with speculation runs and reports."""

from __future__ import annotations

import json

import pytest

from ladle.bench.engine_bench import _workload_from_args, length_range, run_bench
from ladle.bench.vllm_serve_flags import apply_vllm_spellings
from ladle.cli.main import build_parser


def test_vllm_latency_command_line_with_speculation_runs(tmp_path):
    path = tmp_path / "latency.json"
    # vllm bench latency --model M --input-len 16 --output-len 24 --batch-size 2 --num-iters 1
    args = build_parser().parse_args(
        ["bench", "latency", "--model", "tiny-llama", "--load-format", "dummy",
         "--input-len", "16", "--output-len", "24", "--batch-size", "2", "--num-iters", "1",
         "--output-json", str(path), "--no-busy", "--no-progress",
         "--speculative-config",
         '{"method": "ngram", "num_speculative_tokens": 3, "adaptive": false}',
         "--synthetic-acceptance", "0.8"]
    )
    workload = _workload_from_args(args)
    assert (workload.input_len, workload.output_len, workload.num_requests) == (
        (16, 16), (24, 24), 2
    )
    assert run_bench(args) == 0
    result = json.loads(path.read_text())
    assert result["num_requests"] == 2
    speculation = result["speculation"]
    assert speculation["num_drafts"] > 0 and speculation["acceptance_rate"] > 0
    assert speculation["no_spec_tokens_per_s"] > 0 and speculation["speedup_tokens_per_s"] > 0


def test_a_run_without_drafts_says_why():
    from ladle.bench.engine_bench import _why_no_drafts

    assert "adaptive" in _why_no_drafts({"method": "ngram"}, 0)
    assert "found nothing" in _why_no_drafts({"method": "ngram", "adaptive": False}, 0)
    assert _why_no_drafts({"method": "ngram"}, 5) == ""


def test_throughput_takes_num_prompts_and_ranges_stay():
    args = build_parser().parse_args(
        ["bench", "throughput", "--num-prompts", "7", "--input-len", "8", "16"]
    )
    workload = _workload_from_args(args)
    assert workload.num_requests == 7 and workload.input_len == (8, 16)


@pytest.mark.parametrize("values", [[1, 2, 3], [9, 4], [-1]])
def test_bad_lengths_name_the_flag(values):
    with pytest.raises(ValueError, match="--input-len takes LEN or MIN MAX"):
        length_range(values, "--input-len")


def test_vllm_bench_serve_spellings_map_onto_ladle_flags():
    args = build_parser().parse_args(
        ["bench", "serve", "--backend", "vllm", "--host", "10.0.0.2", "--port", "8100",
         "--endpoint", "/v1/completions", "--dataset-name", "random",
         "--random-input-len", "128", "--random-output-len", "64", "--request-rate", "4",
         "--save-result", "--result-dir", "out"]
    )
    apply_vllm_spellings(args)
    assert args.base_url == "http://10.0.0.2:8100"
    assert (args.workload, args.input_len, args.output_len) == ("token-ids", "128:128", "64:64")
    assert (args.rate, args.output_dir) == ("4", "out")
    # ladle's own spellings keep their defaults when vLLM's are absent.
    plain = build_parser().parse_args(["bench", "serve"])
    apply_vllm_spellings(plain)
    assert (plain.rate, plain.base_url, plain.workload) == (
        "inf", "http://127.0.0.1:8000", "sharegpt"
    )


def test_random_lengths_without_the_random_dataset_are_refused():
    args = build_parser().parse_args(["bench", "serve", "--random-input-len", "8"])
    with pytest.raises(ValueError, match="--random-input-len .* --dataset-name random"):
        apply_vllm_spellings(args)


def test_logprobs_flag_reaches_every_request():
    """`--temperature 0.6 --logprobs 0` runs W3 with S1's served sampling options (the sampled
    token's logprob each step, as `ladle bench serve --token-ids` asks)."""
    from ladle.bench.workloads import build_requests

    args = build_parser().parse_args(
        ["bench", "latency", "--workload", "W3", "--temperature", "0.6", "--logprobs", "0"]
    )
    workload = _workload_from_args(args)
    params = build_requests(workload)[0].core_request("r").sampling_params
    assert (params.temperature, params.logprobs) == (0.6, 0)
    default = _workload_from_args(build_parser().parse_args(["bench", "latency"]))
    assert build_requests(default)[0].core_request("r").sampling_params.logprobs is None
