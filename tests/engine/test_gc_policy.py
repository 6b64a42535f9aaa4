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
    from ladle.engine.gc_policy import SERVING_FULL_COLLECTION_EVERY

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        freeze_startup_objects()
        assert gc.get_threshold() == (700, 10, SERVING_FULL_COLLECTION_EVERY)
        assert SERVING_FULL_COLLECTION_EVERY == 100
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
