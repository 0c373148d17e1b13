from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.shared.block_hash import DIGEST_SIZE, hash_block
from tests.unit.scheduler.helpers import FakeWorker, make_request, make_scheduler, run_step

REPO_ROOT = Path(__file__).resolve().parents[3]

# Pairs of 8-token blocks, every id in [0, 32000), on which the old key
# hash((parent, tuple(tokens))) collides under CPython >= 3.8 (its xxHash-style tuple hash).
# Found by a birthday search over random 7-token prefixes, solving for the last token.
OLD_HASH_COLLISIONS = [
    (
        [29961, 29337, 10663, 15693, 24065, 20016, 16286, 6376],
        [13855, 15443, 1871, 2848, 26989, 18053, 82, 0],
    ),
    (
        [31188, 13074, 19755, 31174, 21268, 24836, 22546, 5636],
        [9188, 29291, 25310, 18135, 23690, 23022, 30552, 0],
    ),
]


def chain_digests(token_ids: list[int], block_size: int) -> list[bytes]:
    digests: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = digests[-1] if digests else None
        digests.append(hash_block(parent, token_ids[start : start + block_size]))
    return digests


@pytest.mark.parametrize(("victim", "attacker"), OLD_HASH_COLLISIONS)
def test_blocks_that_collided_under_python_hash_get_different_digests(
    victim: list[int], attacker: list[int]
) -> None:
    assert victim != attacker
    # The old scheme really collides here, for any parent: the attack this module prevents.
    for parent in (None, 12345):
        assert hash((parent, tuple(victim))) == hash((parent, tuple(attacker)))
    assert hash_block(None, victim) != hash_block(None, attacker)
    parent = hash_block(None, [1, 2, 3])
    assert hash_block(parent, victim) != hash_block(parent, attacker)


def test_colliding_prompt_gets_no_prefix_hit_on_another_users_kv() -> None:
    victim, attacker = OLD_HASH_COLLISIONS[0]
    s = make_scheduler(num_blocks=8, block_size=8)
    w = FakeWorker(s.num_blocks, s.block_size)  # fails if a step reads KV of other tokens
    s.add_request(make_request("victim", [*victim, 5], max_tokens=1))
    run_step(s, w)
    s.add_request(make_request("attacker", [*attacker, 5], max_tokens=1))
    plan, _ = run_step(s, w)
    assert plan.new_seqs[0].num_computed_tokens == 0
    s.add_request(make_request("again", [*victim, 6], max_tokens=1))  # a true prefix still hits
    plan, _ = run_step(s, w)
    assert plan.new_seqs[0].num_computed_tokens == 8


def test_encoding_is_sha256_of_marker_parent_and_little_endian_u64_ids() -> None:
    root = hash_block(None, [1, 2, 3])
    assert root == hashlib.sha256(b"\x00" + struct.pack("<3Q", 1, 2, 3)).digest()
    child = hash_block(root, [2**31])
    assert child == hashlib.sha256(b"\x01" + root + struct.pack("<Q", 2**31)).digest()
    assert len(root) == len(child) == DIGEST_SIZE


def test_parent_order_and_boundaries_change_the_digest() -> None:
    root = hash_block(None, [1, 2])
    other_root = hash_block(None, [1, 3])
    digests = {
        hash_block(None, [7, 8]),
        hash_block(root, [7, 8]),
        hash_block(other_root, [7, 8]),
        hash_block(None, [8, 7]),  # order matters
        hash_block(None, [1, 23]),  # no digit or separator ambiguity
        hash_block(None, [12, 3]),
        hash_block(None, [0]),
        hash_block(None, [0, 0]),  # trailing zero ids are not padding
        hash_block(None, []),
    }
    assert len(digests) == 9


def test_large_ids_are_hashed_exactly() -> None:
    ids = [2**31 - 1, 2**31, 2**32, 2**61 - 1, 2**63, 2**64 - 1]
    digests = {hash_block(None, [0, token_id]) for token_id in ids}
    assert len(digests) == len(ids)
    # hash() folds ints modulo 2**61 - 1, so these two keyed the same block before.
    assert hash((None, (0, 2**61 - 1))) == hash((None, (0, 0)))
    assert hash_block(None, [0, 2**61 - 1]) != hash_block(None, [0, 0])


@pytest.mark.parametrize("bad", [-1, 2**64, 1.0, "7"])
def test_bad_token_id_is_rejected_by_value(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"ids must be ints in \[0, 2\*\*64\), got {bad!r}"):
        hash_block(None, [1, bad, 2])  # type: ignore[list-item]


@pytest.mark.parametrize("parent", [b"", b"\x00" * 31, b"\x00" * 33])
def test_parent_of_the_wrong_size_is_rejected(parent: bytes) -> None:
    with pytest.raises(ValueError, match=rf"parent digest must be 32 bytes, got {len(parent)}"):
        hash_block(parent, [1])


def test_chained_digests_are_the_same_in_another_process_with_another_hash_seed() -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2**31]
    expected = [d.hex() for d in chain_digests(prompt, block_size=4)]
    script = (
        "from tests.unit.shared.test_block_hash import chain_digests\n"
        f"print(' '.join(d.hex() for d in chain_digests({prompt!r}, 4)))\n"
    )
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", script],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split() == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 2**64 - 1), max_size=6),
    st.lists(st.integers(0, 2**64 - 1), max_size=6),
    st.booleans(),
)
def test_different_blocks_never_share_a_digest(a: list[int], b: list[int], chained: bool) -> None:
    parent = hash_block(None, [42]) if chained else None
    assert (hash_block(parent, a) == hash_block(None, b)) == (not chained and a == b)
