"""The objects a long-running process made while it started, out of the cyclic collector's way.

A process holding the default model tracks ~313,000 objects once it is loaded (the modules,
torch's and the tokenizer's Python state). None of them is ever garbage, yet every full
(oldest-generation) collection walks them all: 130-165 ms in a worker on a 2-core Zen 4, and
170-300 ms in a gateway, during which a step or the streams stand still (a full collection
comes whenever the objects surviving the young generations reach a quarter of the old ones,
so a busy server meets one every so often). Frozen once start-up is done (`gc.freeze`, as
vLLM does after its engine starts), they are left out of every later collection, and a full
one takes what the objects made since cost: `python -m benchmarks.gc_pause`. The scheduler
imports no torch and holds few objects (its full collections took 9-11 ms): not frozen.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what start-up left behind, then move every object still alive to the
    collector's permanent generation. Returns how many objects are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
