import gc
import weakref

import pytest

from pagedserve.shared.startup_heap import freeze_startup_heap


@pytest.fixture
def thawed():
    yield
    gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: tracked by the collector


def test_what_start_up_made_is_left_out_of_later_collections(thawed):
    kept = [Node() for _ in range(1000)]
    frozen = freeze_startup_heap()
    assert frozen >= len(kept)
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(node) in tracked for node in kept)
    later = Node()
    assert id(later) in {id(o) for o in gc.get_objects()}  # objects made since are collected


def test_garbage_left_by_start_up_is_collected_not_frozen(thawed):
    garbage = Node()
    ref = weakref.ref(garbage)
    del garbage  # a cycle: only the collector frees it
    freeze_startup_heap()
    assert ref() is None
