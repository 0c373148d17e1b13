"""Block tables of requests on top of the block pool: prefix-cache lookups, all-or-nothing
allocation, caching full blocks as they fill, and freeing.

The scheduler talks to it in verbs and block ids only (`get_computed_blocks`,
`allocate_slots`, `cache_blocks`, `free`, `get_block_ids`, `reset_prefix_cache`; the cache
publisher: `take_cache_changes`, `cached_block_hashes`): the tables
and the pool stay inside, and `check_integrity` checks them here, where they live.

Sliding windows (vLLM v1's `SlidingWindowManager`, for one block table shared by every layer):
when every layer of the model attends within a window, the largest of them is
`sliding_window`, and a block whose tokens all lie before the window of the request's next
token is read by no layer again. `allocate_slots` gives such blocks back to the pool first
(a cached one stays findable by its hash until it is evicted); the table keeps their places
(None), which the workers are told as `SKIPPED_BLOCK_ID` and never read.

Beams (beam search) share blocks as the PagedAttention paper describes: `fork` gives a new
sequence its parent's whole table, one more reference on each block, and `copy_on_write`
gives a sequence about to write into a block that another table also holds a fresh block
instead, recording (source, destination) for the workers to copy before the step runs
(`take_block_copies`). Only a fork's unfilled last block is ever shared uncached. A copy whose
sequence gives its blocks back before the plan is sent (preempted while the step is planned)
is dropped: its destination may be taken again in the same step, even as another copy's, and
the workers copy all of a step's blocks at once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedserve.services.scheduler.block_pool import BlockPool, KVBlock
from pagedserve.services.scheduler.cache_changes import CacheDelta
from pagedserve.services.scheduler.request import Request
from pagedserve.shared.block_hash import hash_block, max_hit_blocks

SKIPPED_BLOCK_ID = 0  # what a worker is told for a table entry given back (it never reads it)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        sliding_window: int | None = None,
    ):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window  # the largest window, when every layer has one
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        # request id -> its block table; None: a block given back (slid out of every window)
        self._tables: dict[str, list[KVBlock | None]] = {}
        self._num_cached_blocks: dict[str, int] = {}  # table entries already in the cache map
        self._block_copies: list[tuple[int, int]] = []  # (source, destination) for next plan
        # digests of full blocks that a running parallel sample is computing (not cached yet)
        # -> (its id, its sample group)
        self._computing: dict[bytes, tuple[str, str]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_block_ids(self, request_id: str, start: int = 0) -> list[int]:
        """The request's block table (from entry `start` on) as block ids."""
        table = self._tables.get(request_id, ())[start:]
        return [SKIPPED_BLOCK_ID if b is None else b.block_id for b in table]

    def num_blocks_held(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def take_cache_changes(self) -> CacheDelta:
        """Block digests cached and evicted since the last call (or: publish them all)."""
        return self.pool.changes.take()

    def cached_block_hashes(self) -> list[bytes]:
        """The digest of every block in the prefix cache now."""
        return list(self.pool.cached_blocks)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash (the blocks' contents are no longer trusted)."""
        self.pool.reset_prefix_cache()

    def check_integrity(self, running: Iterable[Request]) -> None:
        """Raise AssertionError naming the first broken invariant of the tables (held only by
        `running` requests, each big enough) and of the pool beneath. Walks every block."""
        running = list(running)
        stray = set(self._tables) - {r.request_id for r in running}
        assert not stray, f"block tables of requests not running: {sorted(stray)}"
        held = [[b for b in table if b is not None] for table in self._tables.values()]
        self.pool.check_integrity(held)
        for request in running:
            self._check_table(request, self._tables.get(request.request_id, []))
        self._check_shared_uncached(running)
        stale = {rid for rid, _ in self._computing.values()} - set(self._tables)
        assert not stale, f"blocks marked as being computed by requests without a table: {stale}"

    def _check_shared_uncached(self, running: list[Request]) -> None:
        """A block shared but not in the prefix cache can only have come from a fork."""
        for r in running:
            for block in self._tables.get(r.request_id, ()):
                if block is not None and block.ref_count > 1 and block.block_hash is None:
                    assert r.beam_group_id is not None, (
                        f"block {block.block_id} is shared by {block.ref_count} tables but "
                        f"not cached, and {r.request_id} is no beam"
                    )

    def _check_table(self, r: Request, table: list[KVBlock | None]) -> None:
        ids = [b.block_id for b in table if b is not None]  # blocks given back hold no place
        assert len(set(ids)) == len(ids), f"{r.request_id}'s table repeats blocks: {ids}"
        assert len(table) * self.block_size >= r.num_computed_tokens, (
            f"{r.request_id}'s table of {len(table)} blocks cannot hold its "
            f"{r.num_computed_tokens} computed tokens"
        )
        # while a step is out, its draft tokens count as computed beyond the known tokens, and
        # so does the token a plan made ahead runs on (async scheduling: its sample is kept)
        ahead = 1 if len(r.kept_sample_steps) == 2 else 0
        assert r.num_computed_tokens <= r.num_tokens + r.num_draft_tokens + ahead, (
            f"{r.request_id} computed {r.num_computed_tokens} of {r.num_tokens} tokens, "
            f"{r.num_draft_tokens} drafts and {ahead} sample in flight planned on"
        )
        assert r.needs_full_send or r.num_sent_blocks == len(table), (
            f"{r.request_id}: workers know {r.num_sent_blocks} blocks, table has {len(table)}"
        )

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of `request`'s full blocks, and how many tokens it covers.

        Never the whole sequence: at least one token is left to compute so that the step has
        logits to sample from. Takes no references; `allocate_slots` does.
        """
        if not self.enable_prefix_caching or request.sampling.prompt_logprobs is not None:
            return [], 0  # prompt logprobs need every prompt position computed (as vLLM)
        num_hit_max = max_hit_blocks(request.num_tokens, self.block_size)
        self._extend_hashes(request, num_hit_max)
        hit_blocks = []
        for block_hash in request.block_hashes[:num_hit_max]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hit_blocks.append(block)
        return hit_blocks, len(hit_blocks) * self.block_size

    def is_being_computed(self, request: Request, num_hit_blocks: int) -> bool:
        """Whether the full block of `request` after its `num_hit_blocks` cached ones is being
        computed by another sample of its group (the n samples of one prompt, admitted
        together): waiting a step for it turns a copy of the prompt into a cache hit."""
        hashes = request.block_hashes
        if request.sample_group is None or num_hit_blocks >= len(hashes):
            return False
        holder_id, group = self._computing.get(hashes[num_hit_blocks], ("", None))
        return group == request.sample_group and holder_id != request.request_id

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVBlock] = ()
    ) -> list[KVBlock] | None:
        """Extend the request's table to hold `num_computed_tokens` + the hit blocks +
        `num_new_tokens`. Returns the blocks appended (hits first), or None, having changed
        nothing, when not every needed block is free. Blocks that slid out of every window
        are given back first."""
        self._free_skipped_blocks(request)
        if not new_computed_blocks:  # fast path: a decode token that fits in the last block
            table = self._tables.get(request.request_id)
            if table and request.num_computed_tokens + num_new_tokens <= len(table) * (
                self.block_size
            ):
                return []
        num_new_blocks = self._num_blocks_to_take(request, num_new_tokens, new_computed_blocks)
        if num_new_blocks is None:
            return None
        table = self._tables.setdefault(request.request_id, [])
        self.pool.touch(new_computed_blocks)
        appended = list(new_computed_blocks)
        if num_new_blocks:
            appended += self.pool.get_new_blocks(num_new_blocks)
        table.extend(appended)
        if new_computed_blocks:
            # Hit blocks are already in the cache map: do not hash them again.
            cached = self._num_cached_blocks.get(request.request_id, 0)
            self._num_cached_blocks[request.request_id] = cached + len(new_computed_blocks)
        self._mark_computing(request, len(table))
        return appended

    def cache_blocks(self, request: Request) -> None:
        """Put every block of the table that `num_computed_tokens` has filled in the cache
        (only over known tokens: a step planned on a sample in flight computes one more)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        rid = request.request_id
        num_cached = self._num_cached_blocks.get(rid, 0)
        if num_full <= num_cached:
            return
        table = self._tables[rid]
        num_full = min(num_full, len(table))
        self._extend_hashes(request, num_full)
        for i in range(num_cached, num_full):
            block = table[i]
            if block is not None:  # given back blocks were cached before they slid out
                self.pool.cache_full_block(block, request.block_hashes[i])
            self._stop_computing(request.block_hashes[i], rid)
        self._num_cached_blocks[rid] = num_full

    def fork(self, parent: Request, child: Request) -> None:
        """Give `child` (a new beam of `parent`, with its computed prefix) the parent's whole
        block table: no block copied, one more reference on each."""
        table = self._tables.get(parent.request_id, [])
        self.pool.touch([b for b in table if b is not None])
        self._tables[child.request_id] = list(table)
        self._num_cached_blocks[child.request_id] = self._num_cached_blocks.get(
            parent.request_id, 0
        )

    def copy_on_write(self, request: Request) -> bool | None:
        """Before `request` writes from `num_computed_tokens` on: if the block written into
        is shared with another table, take a fresh one in its place and record the copy.
        Returns whether a block was copied, or None, having changed nothing, when none is
        free."""
        table = self._tables.get(request.request_id)
        index = request.num_computed_tokens // self.block_size
        if not table or index >= len(table) or table[index].ref_count == 1:
            return False
        if self.pool.num_free_blocks == 0:
            return None
        shared = table[index]
        (table[index],) = self.pool.get_new_blocks(1)
        self.pool.free_blocks([shared])
        self._block_copies.append((shared.block_id, table[index].block_id))
        return True

    def _drop_copies_into_free_blocks(self) -> None:
        """Forget the pending copies whose destination nobody holds any more."""
        blocks = self.pool.blocks
        self._block_copies = [c for c in self._block_copies if blocks[c[1]].ref_count > 0]

    def take_block_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies recorded since the last call, in order; no
        two into the same block (the workers make them all at once)."""
        copies, self._block_copies = self._block_copies, []
        destinations = [d for _, d in copies]
        assert len(set(destinations)) == len(destinations), f"copies collide: {copies}"
        return copies

    def free(self, request: Request) -> None:
        """Give back the request's blocks, last block first, so that a request's tail blocks
        (the least likely to be shared) are evicted before its prefix."""
        table = self._tables.pop(request.request_id, None)
        num_cached = self._num_cached_blocks.pop(request.request_id, 0)
        for block_hash in request.block_hashes[num_cached:]:
            self._stop_computing(block_hash, request.request_id)
        if table:
            self.pool.free_blocks(b for b in reversed(table) if b is not None)
            self._drop_copies_into_free_blocks()

    def _free_skipped_blocks(self, request: Request) -> None:
        """Give back the blocks wholly before the window of the request's next token (at
        position `num_computed_tokens`, which sees keys from `num_computed_tokens - window +
        1` on)."""
        table = self._tables.get(request.request_id)
        if self.sliding_window is None or not table:
            return
        first_needed = request.num_computed_tokens - self.sliding_window + 1
        num_skipped = min(max(0, first_needed) // self.block_size, len(table))
        skipped = [b for b in table[:num_skipped] if b is not None]
        if skipped:
            table[:num_skipped] = [None] * num_skipped
            self.pool.free_blocks(reversed(skipped))

    def _mark_computing(self, request: Request, num_blocks: int) -> None:
        """The full blocks of known tokens that `request`'s table now holds uncached."""
        if not self.enable_prefix_caching or request.sample_group is None:
            return
        num_full = min(num_blocks, request.num_tokens // self.block_size)
        self._extend_hashes(request, num_full)
        start = self._num_cached_blocks.get(request.request_id, 0)
        for block_hash in request.block_hashes[start:num_full]:
            self._computing.setdefault(block_hash, (request.request_id, request.sample_group))

    def _stop_computing(self, block_hash: bytes, request_id: str) -> None:
        if self._computing.get(block_hash, ("",))[0] == request_id:
            del self._computing[block_hash]

    def _num_blocks_to_take(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVBlock]
    ) -> int | None:
        table = self._tables.get(request.request_id, ())
        num_tokens = (
            request.num_computed_tokens
            + len(new_computed_blocks) * self.block_size
            + num_new_tokens
        )
        num_new_blocks = max(
            0, self.num_blocks_for(num_tokens) - len(table) - len(new_computed_blocks)
        )
        # A hit on a free cached block takes it out of the free queue too.
        num_reused_free = sum(1 for b in new_computed_blocks if b.ref_count == 0)
        if num_new_blocks + num_reused_free > self.pool.num_free_blocks:
            return None
        return num_new_blocks

    def _extend_hashes(self, request: Request, num_blocks: int) -> None:
        hashes = request.block_hashes
        tokens = request.all_token_ids
        size = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            block_tokens = tokens[i * size : (i + 1) * size]
            hashes.append(hash_block(parent, block_tokens, request.cache_salt))
