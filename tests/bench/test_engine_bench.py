"""The floor model of `ladle bench` and the decode-graph buckets (pure functions, no device)."""

from __future__ import annotations

from ladle.bench.device_floor import DeviceCeilings, floor_seconds
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
