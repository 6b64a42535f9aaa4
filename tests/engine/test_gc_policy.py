"""Start-up objects leave the garbage collector's scans (gc.freeze) and stay alive."""

from __future__ import annotations

import gc

from ladle.engine.gc_policy import freeze_startup_objects


def test_freeze_moves_live_objects_out_of_the_collectors_reach():
    class Node:
        pass

    node = Node()
    node.self = node  # a cycle: only the collector could ever free it
    gc.unfreeze()
    before = gc.get_freeze_count()
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > before
        assert not any(obj is node for obj in gc.get_objects())  # no generation holds it
        assert node.self is node
    finally:
        gc.unfreeze()
    assert any(obj is node for obj in gc.get_objects())


def test_full_collections_are_ten_times_rarer_after_start_up():
    """Freezing empties the old generation, so Python's quarter-of-the-old-generation rule no
    longer holds full collections back: the serving process raises their threshold instead."""
    from ladle.engine.gc_policy import (
        SERVING_FULL_COLLECTION_EVERY,
        SERVING_YOUNG_COLLECTION_AFTER,
    )

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        freeze_startup_objects()
        assert gc.get_threshold() == (
            SERVING_YOUNG_COLLECTION_AFTER,
            10,
            SERVING_FULL_COLLECTION_EVERY,
        )
        assert SERVING_FULL_COLLECTION_EVERY == 100
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def test_a_256_stream_step_frame_runs_no_collection_after_start_up():
    """Decoding one step's frame for 256 streams and holding it (as the API process does while it
    handles the step) allocates thousands of tracked objects at once: with Python's default
    threshold that ran two young collections per frame, each scanning the frame, a tenth of
    the API process's CPU at 256 streams. After start-up it must run none."""
    from ladle.protocol import wire
    from ladle.protocol.messages import EngineCoreOutput, SchedulerStats, TokenLogprobs

    frame = wire.encode_output(
        wire.EngineStep(
            outputs=[
                EngineCoreOutput(f"cmpl-{i:032x}-0", [i], new_logprobs=[TokenLogprobs(i, -1.5, 1)])
                for i in range(256)
            ],
            stats=SchedulerStats(),
        )
    )
    collections: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        gc.collect()
        gc.callbacks.append(count)
        held = [wire.decode_output(frame) for _ in range(2)]
        assert len(collections) >= 2  # the default threshold: the cost this policy removes
        assert len(held[1].outputs) == 256
        del held
        freeze_startup_objects()
        collections.clear()
        held = [wire.decode_output(frame) for _ in range(2)]
        assert collections == []
        assert len(held[1].outputs) == 256
    finally:
        if count in gc.callbacks:
            gc.callbacks.remove(count)
        gc.unfreeze()
        gc.set_threshold(*saved)


def test_an_offline_run_pauses_the_scans_of_what_was_alive_and_restores_them():
    """During the run: the objects alive at its start are out of the collector's reach and a
    full collection among them does not happen; after it: the thresholds are back, nothing is
    frozen, and a cycle dropped during the run (a dropped engine's, say) is collectable."""
    import weakref

    from ladle.engine.gc_policy import (
        SERVING_FULL_COLLECTION_EVERY,
        SERVING_YOUNG_COLLECTION_AFTER,
        collector_paused_during_run,
    )

    class Node:
        pass

    node = Node()
    node.self = node
    dropped = weakref.ref(node)
    saved = gc.get_threshold()
    gc.unfreeze()
    try:
        gc.set_threshold(700, 10, 10)
        with collector_paused_during_run():
            assert gc.get_freeze_count() > 0
            assert gc.get_threshold() == (
                SERVING_YOUNG_COLLECTION_AFTER, 10, SERVING_FULL_COLLECTION_EVERY
            )
            assert not any(obj is node for obj in gc.get_objects())
            del node
            gc.collect()
            assert dropped() is not None  # frozen: no collection reaches it during the run
        assert gc.get_freeze_count() == 0 and gc.get_threshold() == (700, 10, 10)
        gc.collect()
        assert dropped() is None  # after the run, as if nothing had been frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def test_a_serving_process_keeps_its_frozen_start_up_objects_through_a_run():
    from ladle.engine.gc_policy import collector_paused_during_run

    saved = gc.get_threshold()
    gc.unfreeze()
    try:
        freeze_startup_objects()
        frozen, thresholds = gc.get_freeze_count(), gc.get_threshold()
        with collector_paused_during_run():
            pass
        assert gc.get_freeze_count() >= frozen and gc.get_threshold() == thresholds
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def test_llm_generate_runs_with_the_collector_paused(tiny_model_path):
    from ladle import LLM, SamplingParams

    llm = LLM(tiny_model_path("llama"), block_size=4, num_kv_blocks=64)
    frozen_during_steps: list[int] = []
    step = llm.engine.step

    def counting_step():
        frozen_during_steps.append(gc.get_freeze_count())
        return step()

    llm.engine.step = counting_step
    gc.unfreeze()
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert frozen_during_steps and min(frozen_during_steps) > 0
    assert gc.get_freeze_count() == 0
