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

Only processes that hold one engine for life freeze for good (the engine-core process, the API
process, the workers of a multi-process engine): an offline program may build and drop several
LLMs, and a dropped engine's reference cycles, once frozen, would keep its KV cache allocated.
An offline run (`LLM.generate`, a benchmark's timed loop) pauses the collector's scans of what
was alive when it began for as long as it runs, and unfreezes when it ends
(`collector_paused_during_run`): a full collection
among the engine's objects stalled a W2-70b decode step 67 ms at TP=4 (rank 0's GPU idle,
waiting for the engine's next plan; docs/benchmarks.md, session 46), and took 134 ms over the
~480,000 tracked objects of a tiny engine on this project's CPU.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

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


@contextlib.contextmanager
def collector_paused_during_run() -> Iterator[None]:
    """For an offline run: what is alive when it begins leaves the collector's scans and
    collections are as rare as while serving; when it ends, everything is as it was (gc.unfreeze
    and the thresholds), so a dropped engine's cycles stay collectable. Garbage made during the
    run is collected as usual. Does nothing where objects are frozen already (a serving process
    froze its start-up objects for good) or the program turned the collector off."""
    if gc.get_freeze_count() > 0 or not gc.isenabled():
        yield
        return
    saved = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(SERVING_YOUNG_COLLECTION_AFTER, saved[1], SERVING_FULL_COLLECTION_EVERY)
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        gc.unfreeze()
