"""Keep Python's cyclic garbage collector off the serving path.

The collector runs after every few hundred allocations, and its older generations scan every
tracked object alive: after start-up that is the model's modules, the tokenizer, the web
framework, the scheduler's tables, hundreds of thousands of objects, rescanned again and again
while serving. Measured on the API side of a 256-request step (decoding one EngineStep frame),
0.6 ms without the collector, 7-8 ms with it among start-up's objects, 1.9 ms once they were
frozen. So once a process is ready to serve, its start-up objects move to the collector's
permanent generation (gc.freeze): they stay alive as before and are never scanned again.
Garbage made while serving is collected as usual.

Full collections stay rare while serving. Python runs one when, after threshold2 (default 10)
collections of the middle generation, the objects promoted since the last one exceed a quarter
of the old generation, and freezing empties the old generation: a busy API process (128 streams
of ~170 tokens/s, a few objects a token outliving the young collections) met that twice a
second, and each full collection scanned every live stream's objects, 20-130 ms in which no
stream got a token (docs/benchmarks.md, the lead's 2026-11-23 evening section). So threshold2
goes from 10 to SERVING_FULL_COLLECTION_EVERY: cyclic garbage still gets collected, ten times
less often.

Young collections are made rarer too (SERVING_YOUNG_COLLECTION_AFTER allocations instead of
700). A young collection runs once tracked allocations outnumber deallocations by the threshold,
and it scans every young object still alive. While a step's frame is processed, its objects are
all alive at once (the API process decodes one EngineCoreOutput, its lists and TokenLogprobs per
stream, then a snapshot and a chunk per stream): at 256 streams that is thousands, so the
default threshold ran a young collection every ~40 tokens, each scanning a frame's live objects
and promoting them for the middle generation to scan again. Measured in the API process's own
code at 256 streams (scripts/api_path_cpu.py, this project's 2-core VM, medians of 4
interleaved runs): 21.0 -> 18.4 us of CPU per token, the collector's 2.2-3.0 us per token gone
(docs/benchmarks.md, helper t8s2). Most of what a step allocates dies by reference count before
a collection; only cyclic garbage waits longer, and a collection of 20,000 young objects takes
about a millisecond.

Only processes that hold one engine for life freeze (the engine-core process, the API process):
an offline program may build and drop several LLMs, and a dropped engine's reference cycles,
once frozen, would keep its KV cache allocated.
"""

from __future__ import annotations

import gc

# Middle-generation collections between two full ones while serving (Python's default: 10).
SERVING_FULL_COLLECTION_EVERY = 100
# Net tracked allocations that start a young collection while serving (Python's default: 700);
# well above what one step of a thousand streams holds alive at once.
SERVING_YOUNG_COLLECTION_AFTER = 20_000


def freeze_startup_objects() -> None:
    """Collect what start-up left behind, exempt everything alive from later scans, and make
    young and full collections rarer from now on."""
    gc.collect()
    gc.freeze()
    _, middle, _ = gc.get_threshold()
    gc.set_threshold(SERVING_YOUNG_COLLECTION_AFTER, middle, SERVING_FULL_COLLECTION_EVERY)
