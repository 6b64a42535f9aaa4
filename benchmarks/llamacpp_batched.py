"""llama.cpp decoding many sequences at once, through llama-cpp-python's low-level API (its
high-level `Llama.generate` runs one sequence): the peer of ladle's batched CPU decode.

    context = batched_context(llama, num_sequences, context_len, threads)
    time_llamacpp_batched(llama, context, prompts, max_tokens) -> seconds, prefill + greedy decode
"""

from __future__ import annotations

import time

import numpy as np


def batched_context(model, num_sequences: int, context_len: int, threads: int):
    """A llama.cpp context over `model`'s weights (a `llama_cpp.Llama`) holding num_sequences
    sequences in one unified KV cache of context_len tokens (free it with llama_cpp.llama_free)."""
    import llama_cpp

    params = llama_cpp.llama_context_default_params()
    params.n_ctx = context_len
    params.n_batch = context_len
    params.n_ubatch = 512
    params.n_seq_max = num_sequences
    params.kv_unified = True
    params.n_threads = params.n_threads_batch = threads
    context = llama_cpp.llama_init_from_model(model.model, params)
    if not context:
        raise RuntimeError("llama.cpp could not create a batched context")
    return context


def time_llamacpp_batched(model, context, prompts: list[list[int]], max_tokens: int) -> float:
    """Prefill every prompt as its own sequence in one batch, then decode `max_tokens` greedy
    tokens for all of them, one batched llama_decode per step. context: from batched_context."""
    import llama_cpp

    memory = llama_cpp.llama_get_memory(context)
    llama_cpp.llama_memory_clear(memory, True)
    vocab_size = model.n_vocab()
    num_prompt_tokens = sum(map(len, prompts))
    batch = llama_cpp.llama_batch_init(max(num_prompt_tokens, len(prompts)), 0, len(prompts))
    try:
        started = time.perf_counter()
        last_index = _fill(batch, [(seq, prompt, 0) for seq, prompt in enumerate(prompts)])
        positions = [len(prompt) for prompt in prompts]
        for _ in range(max_tokens):
            if llama_cpp.llama_decode(context, batch) != 0:
                raise RuntimeError("llama_decode failed")
            next_tokens = []
            for index in last_index:
                logits = llama_cpp.llama_get_logits_ith(context, index)
                next_tokens.append(int(np.ctypeslib.as_array(logits, (vocab_size,)).argmax()))
            last_index = _fill(
                batch,
                [(seq, [token], positions[seq]) for seq, token in enumerate(next_tokens)],
            )
            positions = [position + 1 for position in positions]
        return time.perf_counter() - started
    finally:
        llama_cpp.llama_batch_free(batch)


def _fill(batch, sequences: list[tuple[int, list[int], int]]) -> list[int]:
    """Put (sequence id, tokens, first position) runs into the batch, asking for the logits of
    each run's last token; returns those tokens' indices in the batch."""
    count, last_index = 0, []
    for seq, tokens, start in sequences:
        for offset, token in enumerate(tokens):
            batch.token[count] = token
            batch.pos[count] = start + offset
            batch.n_seq_id[count] = 1
            batch.seq_id[count][0] = seq
            batch.logits[count] = offset == len(tokens) - 1
            count += 1
        last_index.append(count - 1)
    batch.n_tokens = count
    return last_index
