"""cache_salt as a tenant's prefix-cache namespace: the salt enters the first block's digest,
so identical prompts share blocks within a tenant and none across tenants."""

from __future__ import annotations

import dataclasses

import pytest

from pagedserve.services.scheduler.errors import RequestRejectedError
from pagedserve.shared.block_hash import hash_block
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler, run_step

PROMPT = list(range(13))  # 3 full blocks + 1 token at block size 4


def salted(request_id: str, salt: str | None, max_tokens: int = 1):
    return dataclasses.replace(make_request(request_id, PROMPT, max_tokens), cache_salt=salt)


def hits_after(requests) -> list[int]:
    """Run each request to completion in turn; the prefix-cache hit tokens of each."""
    s = make_scheduler(num_blocks=16, block_size=4)
    w = FakeWorker(16, 4)
    hits = []
    for request in requests:
        before = s.stats().prefix_cache_hits
        s.add_request(request)
        run_step(s, w)
        assert not s.has_unfinished_requests()
        hits.append(s.stats().prefix_cache_hits - before)
    assert s.kv.num_free_blocks == 16
    return hits


def test_the_same_tenant_shares_its_prompt_blocks():
    assert hits_after([salted("a", "tenant-1"), salted("b", "tenant-1")]) == [0, 12]


def test_different_tenants_share_no_block():
    assert hits_after([salted("a", "tenant-1"), salted("b", "tenant-2")]) == [0, 0]


def test_a_salted_request_and_an_unsalted_one_share_no_block():
    assert hits_after([salted("a", None), salted("b", "x"), salted("c", None)]) == [0, 0, 12]


def test_salt_changes_every_block_of_the_chain_and_is_unambiguous():
    first = hash_block(None, [1, 2], "s")
    assert first != hash_block(None, [1, 2]) != hash_block(None, [1, 2], "t")
    assert hash_block(first, [3, 4]) != hash_block(hash_block(None, [1, 2]), [3, 4])
    assert hash_block(None, [1], "") != hash_block(None, [1])  # length prefix: "" is a salt


@pytest.mark.parametrize("salt", ["", 5])
def test_bad_salts_are_rejected_naming_the_field(salt):
    s = make_scheduler()
    with pytest.raises(RequestRejectedError, match="cache_salt"):
        s.add_request(salted("a", salt))
