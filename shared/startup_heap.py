"""The objects a long-running process made while it started, out of the cyclic collector's way.

A worker holds ~320,000 objects the collector tracks once its model is loaded (the modules,
torch's and the tokenizer's Python state), and a gateway about as many. None of them is ever
garbage, yet every full (oldest-generation) collection walks them all: 160-200 ms on a 2-core
Zen 4 each, during which a worker's step or a gateway's streams stand still (a full collection
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
