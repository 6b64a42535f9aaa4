"""The floor model of `ladle bench` and the decode-graph buckets (pure functions, no device)."""

from __future__ import annotations

import pytest
import torch

from ladle.bench.device_floor import (
    DeviceCeilings,
    ExpertWeights,
    active_params,
    expert_weights,
    floor_seconds,
)
from ladle.worker.cuda_graphs import graph_batch_sizes, padded_batch_size


def test_floor_is_the_larger_of_bytes_and_flops():
    ceilings = DeviceCeilings(copy_bytes_per_s=1e9, matmul_flops_per_s=1e12)
    # One request, 10 prompt + 4 generated tokens: 4 steps reading 1 GB of weights each,
    # KV reads 10*4 + (1+2+3+4) = 50 tokens of 100 bytes.
    seconds = floor_seconds(
        ceilings,
        num_params=1000,
        weights_bytes=10**9,
        kv_bytes_per_token=100,
        prompt_lens=[10],
        output_lens=[4],
        max_num_seqs=8,
    )
    assert seconds == (4 * 10**9 + 5000) / 1e9
    # Two requests that fit one batch share their steps: 5 steps, not 4 + 5.
    shared = floor_seconds(
        ceilings,
        num_params=1000,
        weights_bytes=10**9,
        kv_bytes_per_token=0,
        prompt_lens=[1, 1],
        output_lens=[4, 5],
        max_num_seqs=8,
    )
    assert shared == 5.0
    # With room for one at a time they run one after the other.
    serial = floor_seconds(
        ceilings,
        num_params=1000,
        weights_bytes=10**9,
        kv_bytes_per_token=0,
        prompt_lens=[1, 1],
        output_lens=[4, 5],
        max_num_seqs=1,
    )
    assert serial == 9.0


# 1000 parameters of which 800 in 4 experts, one per token; 1 GB of weights of which 0.8 in
# experts.
EXPERTS = ExpertWeights(num_experts=4, num_experts_per_token=1, num_params=800, num_bytes=8 * 10**8)


def _moe_floor(ceilings: DeviceCeilings, output_lens: list[int], prompt_len: int = 1) -> float:
    return floor_seconds(
        ceilings,
        num_params=1000,
        weights_bytes=10**9,
        kv_bytes_per_token=0,
        prompt_lens=[prompt_len] * len(output_lens),
        output_lens=output_lens,
        max_num_seqs=256,
        experts=EXPERTS,
    )


def test_moe_floor_reads_the_active_experts_at_batch_1_and_all_at_large_batches():
    bandwidth_bound = DeviceCeilings(copy_bytes_per_s=1e9, matmul_flops_per_s=1e30)
    # Batch 1: each of 4 steps reads the 0.2 GB outside the experts and 1 of 4 experts (0.2 GB).
    assert _moe_floor(bandwidth_bound, [4]) == pytest.approx(4 * 0.4)
    # Two tokens a step: an expert escapes both with probability (3/4)^2, so 7/16 of the
    # experts are read: 0.2 + 0.8 * 7/16 = 0.55 GB a step.
    assert _moe_floor(bandwidth_bound, [3, 3]) == pytest.approx(3 * 0.55)
    # 64 tokens in one step read (all but (3/4)^64 ~ 1e-8 of) every expert once: 1 GB.
    assert _moe_floor(bandwidth_bound, [1] * 64) == pytest.approx(1.0, rel=1e-7)
    # Without the experts' description the model is dense: every step reads all of it.
    dense = floor_seconds(
        bandwidth_bound,
        num_params=1000,
        weights_bytes=10**9,
        kv_bytes_per_token=0,
        prompt_lens=[1],
        output_lens=[4],
        max_num_seqs=256,
    )
    assert dense == pytest.approx(4.0)


def test_moe_floor_counts_the_arithmetic_of_the_active_parameters():
    compute_bound = DeviceCeilings(copy_bytes_per_s=1e30, matmul_flops_per_s=1e3)
    # 200 parameters outside the experts + 800 / 4: 400 active; 10 + 2 tokens, 2 flops each.
    assert active_params(1000, EXPERTS) == 400
    assert _moe_floor(compute_bound, [2], prompt_len=10) == pytest.approx(2 * 400 * 12 / 1e3)
    assert EXPERTS.share_read(1) == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("preset", "total", "active"),
    [
        # The published sizes: 30.5B / 3.3B, 235B / 22B, 46.7B / 12.9B.
        ("qwen3-30b-a3b", 30.5e9, 3.35e9),
        ("qwen3-235b-a22b", 235.1e9, 22.2e9),
        ("mixtral-8x7b", 46.7e9, 12.9e9),
    ],
)
def test_moe_presets_have_their_published_total_and_active_sizes(preset, total, active):
    from ladle.attention.torch_backend import TorchAttentionBackend
    from ladle.model.arch_config import ModelArchConfig
    from ladle.model.loader.presets import get_preset
    from ladle.model.models.registry import get_model_class

    arch = ModelArchConfig.from_hf_dict(get_preset(preset))
    with torch.device("meta"):  # shapes only, no memory
        model = get_model_class(arch.architecture)(arch, TorchAttentionBackend())
    num_params = sum(p.numel() for p in model.parameters())
    experts = expert_weights(model)
    assert experts is not None and experts.num_experts == arch.num_experts
    assert experts.num_bytes == 4 * experts.num_params  # the meta model is float32
    assert num_params == pytest.approx(total, rel=0.01)
    assert active_params(num_params, experts) == pytest.approx(active, rel=0.01)


def test_graph_buckets_cover_every_batch_size():
    sizes = graph_batch_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256
    assert graph_batch_sizes(3) == [1, 2, 3]
    for num_reqs in range(1, 257):
        padded = padded_batch_size(num_reqs, sizes)
        assert padded is not None and padded >= num_reqs
        assert padded - num_reqs < 16
    assert padded_batch_size(257, sizes) is None


def test_bench_flags_override_the_workload():
    from ladle.bench.engine_bench import _workload_from_args, run_bench
    from ladle.cli.main import build_parser

    args = build_parser().parse_args(
        ["bench", "latency", "--workload", "W3", "--input-len", "8", "16", "--enforce-eager"]
    )
    assert args.handler is run_bench and args.enforce_eager
    workload = _workload_from_args(args)
    assert workload.input_len == (8, 16) and workload.fixed_input_len is None
    assert workload.output_len == (256, 256)  # W3's own, not overridden


def test_python_dash_m_ladle_runs_the_cli():
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "ladle", "bench", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "throughput" in result.stdout and "latency" in result.stdout


def test_the_warm_up_runs_a_one_request_workload_as_timed_and_cuts_a_many_request_one():
    """W3's warm-up is its one request as timed; W2's is 4 requests cut to a few tokens, so a
    --profile-ranks window of steps 100-150 falls in the timed run, not in a warm-up of up to
    1,024 tokens a request."""
    from ladle.bench.engine_bench import WARMUP_TOKENS, warmup_requests
    from ladle.bench.workloads import W2, W3_SMALL, build_requests

    w3 = build_requests(W3_SMALL)
    assert warmup_requests(w3) == w3
    w2 = build_requests(W2)
    warmup = warmup_requests(w2)
    assert [r.prompt_token_ids for r in warmup] == [r.prompt_token_ids for r in w2[:4]]
    assert [r.max_tokens for r in warmup] == [min(r.max_tokens, WARMUP_TOKENS) for r in w2[:4]]
    assert max(r.max_tokens for r in w2[:4]) > 100 >= sum(r.max_tokens for r in warmup)
