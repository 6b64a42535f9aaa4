"""A steady decode step issues few aten ops outside the model forward (issue 38).

On CUDA each such op is about one launch (a kernel, a cudaMemcpyAsync, a memset), and with many
requests decoding on a small model the host's launches between graph replays kept the GPU 27%
idle. The count is taken on the CPU engine with the decode graphs emulated (the same Python
issues the same ops; helpers/host_ops.py), so it guards the GPU path without a GPU.

Measured with this test's own setup (helpers.host_ops.decode_step_ops, 13 greedy requests
padded to the graph bucket of 16, 6 steps), 2026-11-28: 10 ops per step, of which copy_ 2 (the
graph words' copy, on CUDA the step's second host-to-device copy, and the ids' cast into the
graph's buffer); before the cut (main 5b2537e): 16, of which copy_ 5. The bound on all ops
leaves one of margin; growing past it means a new launch in every decode step.
"""

from __future__ import annotations

import torch
from helpers.emulated_graphs import install_emulated_graphs
from helpers.host_ops import decode_step_ops

from ladle import LLM

MAX_OPS_PER_STEP = 11
MAX_COPIES_PER_STEP = 2


def test_a_decode_step_issues_few_host_ops(tiny_model_path):
    torch.set_num_threads(1)
    llm = LLM(tiny_model_path("qwen3"), device="cpu", async_scheduling=True, max_num_seqs=16)
    install_emulated_graphs(llm.engine.executor.worker)
    runner = llm.engine.executor.worker.runner
    counter, num_steps = decode_step_ops(llm, num_requests=13, prompt_len=5, num_steps=6)
    assert num_steps == 6
    assert runner.num_graph_steps >= num_steps  # the graph path was the one counted
    by_op = counter.by_op()
    per_step = counter.total() / num_steps
    detail = {site: count for site, count in counter.counts.items()}
    assert per_step <= MAX_OPS_PER_STEP, detail
    assert by_op["copy_"] / num_steps <= MAX_COPIES_PER_STEP, detail
