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

Only processes that hold one engine for life freeze (the engine-core process, the API process):
an offline program may build and drop several LLMs, and a dropped engine's reference cycles,
once frozen, would keep its KV cache allocated.
"""

from __future__ import annotations

import gc

# Middle-generation collections between two full ones while serving (Python's default: 10).
SERVING_FULL_COLLECTION_EVERY = 100


def freeze_startup_objects() -> None:
    """Collect what start-up left behind, exempt everything alive from later scans, and make
    full collections rarer from now on."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, SERVING_FULL_COLLECTION_EVERY)
