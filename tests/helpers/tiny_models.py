"""Tiny random Hugging Face checkpoints (with a real tokenizer) for tests, and a helper that lays
sequences into a paged KV cache the way the scheduler would.

Fixtures (tests/conftest.py), all session-scoped and cached, so each model is built once:

    tiny_model_path(architecture="llama", sharded=False) -> str
        A folder with config.json, *.safetensors (sharded with an index when sharded=True),
        generation_config.json and a tokenizer (tokenizer.json, ChatML chat template).
        Architectures: 'llama', 'llama3_scaled' (llama3 rope scaling), 'llama_tied' (tied
        embeddings), 'qwen2' (q/k/v bias), 'qwen3' (q/k norm), 'mistral' (no sliding window).
        All: hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16, intermediate 128,
        max_position_embeddings 512, vocab = the tokenizer's (512).
        Mixtures of experts (MOE_ARCHITECTURES), 8 experts of width 32, top-2:
        'qwen3_moe' (every layer sparse, norm_topk_prob true), 'qwen3_moe_mixed' (4 layers,
        decoder_sparse_step 2 and mlp_only_layers [1]: only layer 3 sparse; norm_topk_prob
        false), 'mixtral'.
    tiny_tokenizer -> PreTrainedTokenizerFast (the one saved beside every tiny model)

Tokenizer: byte-level BPE; specials '<|pad|>' (0), '<|begin_of_text|>' (1, bos, not added
automatically), '<|im_start|>' (2), '<|im_end|>' (3, eos). Any text encodes.

Outside fixtures: save_tiny_model(tmp_dir, architecture, sharded=False, **config_overrides),
load_hf_reference(path) (the HF model, fp32, eval) and PagedBatch (see its docstring).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ladle.attention.metadata import AttentionMetadata

TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
)
TINY_VOCAB_SIZE = 512
# The GPU tests' tiny shape: wide enough for the fused kernels' tiles and the graph buckets.
GPU_SHAPE = dict(
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
)
SPECIAL_TOKENS = ["<|pad|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]
PAD_ID, BOS_ID, IM_START_ID, EOS_ID = range(4)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# A llama3 scaling whose band edges (64 / 4 and 64 / 1 tokens) fall inside head_dim 16's
# wavelengths, so the kept, interpolated and divided frequencies are all exercised.
LLAMA3_TINY_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
MOE_ARCHITECTURES = ("qwen3_moe", "qwen3_moe_mixed", "mixtral")
ARCHITECTURES = ("llama", "llama3_scaled", "llama_tied", "qwen2", "qwen3", "mistral")
ARCHITECTURES += MOE_ARCHITECTURES
TINY_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)

_TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. A paged cache keeps the keys and values of every
request in fixed-size blocks, so memory is never wasted on padding. When a request finishes,
its blocks go back to the pool and another request can use them at once.
Once upon a time there was a little engine that served many people at the same time. Each person
asked a question, and the engine answered them all together, one token at a time, as fast as it
could. Some questions were long and some were short; the engine did not mind.
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris is
the capital of France. What is two plus two? Two plus two is four. Numbers: 0 1 2 3 4 5 6 7 8 9.
In the beginning the model reads the whole prompt; this is called prefill. Afterwards it writes
one new token per step; this is called decode. A scheduler decides which requests run in each
step, and how many tokens each of them may process, within one shared budget of tokens.
"""


def build_tiny_tokenizer():
    """Train the byte-level BPE in-process (deterministic, well under a second)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TRAINING_TEXT.splitlines(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|pad|>",
        bos_token="<|begin_of_text|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


def tiny_hf_config(architecture: str, vocab_size: int, **config_overrides):
    """The transformers config object of one tiny architecture."""
    from transformers import (
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    values = dict(
        TINY_SHAPE,
        vocab_size=vocab_size,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    if architecture == "llama":
        config_class = LlamaConfig
    elif architecture == "llama3_scaled":
        config_class = LlamaConfig
        values["rope_scaling"] = dict(LLAMA3_TINY_SCALING)
    elif architecture == "llama_tied":
        config_class = LlamaConfig
        values["tie_word_embeddings"] = True
    elif architecture == "qwen2":
        config_class = Qwen2Config
    elif architecture == "qwen3":
        config_class = Qwen3Config
    elif architecture == "mistral":
        config_class = MistralConfig
        values["sliding_window"] = None
    elif architecture == "qwen3_moe":
        config_class = Qwen3MoeConfig
        values.update(TINY_MOE, norm_topk_prob=True)
    elif architecture == "qwen3_moe_mixed":
        config_class = Qwen3MoeConfig
        values.update(TINY_MOE, norm_topk_prob=False, num_hidden_layers=4)
        values.update(decoder_sparse_step=2, mlp_only_layers=[1])
    elif architecture == "mixtral":
        config_class = MixtralConfig
        values.update(
            num_local_experts=TINY_MOE["num_experts"],
            num_experts_per_tok=TINY_MOE["num_experts_per_tok"],
            intermediate_size=TINY_MOE["moe_intermediate_size"],
            sliding_window=None,
        )
    else:
        raise ValueError(f"unknown tiny architecture {architecture!r}; use one of {ARCHITECTURES}")
    values.update(config_overrides)
    return config_class(**values)


@torch.no_grad()
def _randomize(model: torch.nn.Module, seed: int) -> None:
    # HF initialises norms to ones and biases to zeros, which would hide a bias or norm weight
    # that is never loaded; and its std 0.02 makes attention nearly uniform, which would hide
    # a rotary or masking bug. Weights of std 0.1 give sharp, position-sensitive attention.
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=generator)
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.1 * noise)
        else:
            param.copy_(0.1 * noise)


def save_tiny_model(
    tmp_dir: str | Path, architecture: str, sharded: bool = False, seed: int = 0, **config_overrides
) -> str:
    """Build, randomise (fixed seed) and save a tiny HF model and its tokenizer; return the path.
    sharded=True splits the safetensors into several files with an index."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tiny_tokenizer()
    # vocab_size may exceed the tokenizer, as in real models whose embedding is padded.
    vocab_size = config_overrides.pop("vocab_size", len(tokenizer))
    config = tiny_hf_config(architecture, vocab_size, **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, seed)
    path = Path(tmp_dir) / (architecture + ("_sharded" if sharded else ""))
    model.save_pretrained(path, max_shard_size="100KB" if sharded else "1GB")
    tokenizer.save_pretrained(path)
    return str(path)


def load_hf_reference(path: str | Path):
    """The saved model through transformers itself, float32, eval mode: the reference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


class PagedBatch:
    """Lays several sequences into a paged KV cache and builds each step's AttentionMetadata,
    as the scheduler and model runner would, so model tests need neither.

    Blocks are handed out from a shuffled pool (never block 0, the null block), so a sequence's
    blocks are not contiguous and a bug that assumes they are shows up.

        batch = PagedBatch(num_seqs=3, block_size=4, num_blocks=64)
        input_ids, positions, metadata = batch.step([chunk_0, chunk_1, chunk_2])

    Each chunk is the list of new token ids of that sequence in this step (may be empty).
    """

    def __init__(self, num_seqs: int, block_size: int, num_blocks: int, seed: int = 0) -> None:
        self.block_size = block_size
        self.free_blocks = list(range(1, num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.block_tables: list[list[int]] = [[] for _ in range(num_seqs)]
        self.num_computed = [0] * num_seqs

    def step(
        self, chunks: list[list[int]], device: torch.device | str = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        for index, chunk in enumerate(chunks):
            start = self.num_computed[index]
            seq_len = start + len(chunk)
            table = self.block_tables[index]
            while len(table) * self.block_size < seq_len:
                table.append(self.free_blocks.pop())
            for position in range(start, seq_len):
                block = table[position // self.block_size]
                slots.append(block * self.block_size + position % self.block_size)
            input_ids.extend(chunk)
            positions.extend(range(start, seq_len))
            query_start_loc.append(len(input_ids))
            seq_lens.append(seq_len)
            self.num_computed[index] = seq_len
        max_blocks = max(1, max(len(table) for table in self.block_tables))
        tables = [table + [0] * (max_blocks - len(table)) for table in self.block_tables]
        query_lens = [len(chunk) for chunk in chunks]
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            block_size=self.block_size,
            query_start_loc_host=query_start_loc,
            seq_lens_host=seq_lens,
        )
        return (
            torch.tensor(input_ids, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
            metadata,
        )


def make_kv_caches(
    arch,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """One zeroed [2, num_blocks, block_size, num_kv_heads, head_dim] cache per layer of a
    model's architecture config (a loaded model's arch_config, a runner's arch)."""
    shape = (2, num_blocks, block_size, arch.num_key_value_heads, arch.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(arch.num_hidden_layers)]


@torch.no_grad()
def paged_logits(
    loaded,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    prompts: list[list[int]] | None = None,
) -> torch.Tensor:
    """A loaded model's logits for `prompts` (default: two fixed ones) in one paged step (every
    position), its KV cache on `device` in `dtype` (the model's)."""
    prompts = prompts or [list(range(4, 9)), list(range(20, 31))]
    num_blocks = sum(-(-len(prompt) // 4) for prompt in prompts) + 1
    batch = PagedBatch(len(prompts), 4, num_blocks)
    input_ids, positions, metadata = batch.step(prompts, device=device)
    caches = make_kv_caches(loaded.arch_config, num_blocks, 4, dtype=dtype, device=device)
    return loaded.model.compute_logits(loaded.model(input_ids, positions, caches, metadata))


def load_on_device(path: str | Path, device: torch.device, dtype: torch.dtype):
    """A model folder loaded as the engine would on `device` in `dtype` (bfloat16 or float32),
    with that device's attention backend."""
    from ladle.attention.backend import get_attention_backend
    from ladle.config import ModelConfig
    from ladle.model.loader import load_model

    dtype_name = {torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype]
    config = ModelConfig(model=str(path), dtype=dtype_name)
    return load_model(config, device, dtype, get_attention_backend(device))


def folder_logits(
    path: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    prompts: list[list[int]] | None = None,
) -> torch.Tensor:
    """paged_logits of the folder loaded on `device` in `dtype`, as float32 on the CPU."""
    loaded = load_on_device(path, device, dtype)
    return paged_logits(loaded, device, dtype, prompts).float().cpu()


def load_float32_on_cpu(path: str | Path):
    """A model folder loaded as the engine would on the CPU in float32 (the torch attention
    backend): the quantize-and-load-back tests' reference and reload."""
    from ladle.attention.torch_backend import TorchAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.loader import load_model

    config = ModelConfig(model=str(path), dtype="float32")
    return load_model(config, torch.device("cpu"), torch.float32, TorchAttentionBackend())


def write_calibration_text(folder: Path) -> Path:
    """A small, fixed calibration text file for `ladle quantize --calibration-data`."""
    text = folder / "calibration.txt"
    text.write_text(" ".join(f"word{i % 97} and {i % 13} more" for i in range(400)))
    return text


def quantize_calibrated(
    tmp_path: Path, architecture: str, out_name: str, *options: str, method: str = "int4"
):
    """A tiny model (intermediate size 200) quantized to `method` by `ladle quantize OPTIONS` in
    float32 on the calibration text (3 windows of 40 tokens). Returns (the float model's folder,
    the output folder, the same calibration windows for the in-memory pass to compare with)."""
    from ladle.cli.main import main
    from ladle.model.loader.calibration_text import token_windows
    from ladle.model.tokenizer import load_tokenizer

    float_model = save_tiny_model(tmp_path, architecture, intermediate_size=200)
    text = write_calibration_text(tmp_path)
    out = tmp_path / out_name
    argv = ["quantize", float_model, str(out), "--method", method, "--dtype", "float32"]
    argv += ["--calibration-data", str(text), "--calibration-samples", "3"]
    argv += ["--calibration-tokens", "40", *options]
    assert main(argv) == 0
    windows = token_windows(load_tokenizer(float_model), [text.read_text()], 120, 40)
    return float_model, out, windows


def save_gemm_aligned_tiny_model(folder: Path, **config_overrides) -> str:
    """A tiny qwen2 whose projection sizes are multiples of 16 (what the fp8 and int8 GEMMs on
    the GPU take without falling back)."""
    sizes = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64}
    return save_tiny_model(folder, "qwen2", **{**sizes, **config_overrides})


def install_calibrated_(model: torch.nn.Module, method, results: dict) -> None:
    """A calibration pass's results (calibrate_linears) installed and finalized in `model`, as
    loading the written checkpoint does; entries holding only folded float tensors (AWQ's
    norms, already changed in place by the pass) are skipped."""
    from ladle.model.layers.quant.base import install_canonical_

    for name, canonical in results.items():
        if "float" in canonical:
            continue
        module = model.get_submodule(name)
        install_canonical_(module, method, canonical)
        method.finalize(module)


def hf_greedy(model, prompt: list[int], num_new_tokens: int) -> list[int]:
    """Greedy decoding with HF's own KV cache: the reference."""
    with torch.no_grad():
        input_ids = torch.tensor([prompt])
        outputs = model(input_ids, use_cache=True)
        generated = []
        for _ in range(num_new_tokens):
            next_token = int(outputs.logits[0, -1].argmax())
            generated.append(next_token)
            outputs = model(
                torch.tensor([[next_token]]),
                past_key_values=outputs.past_key_values,
                use_cache=True,
            )
    return generated
