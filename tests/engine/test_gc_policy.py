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
