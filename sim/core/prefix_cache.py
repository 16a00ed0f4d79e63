"""Automatic prefix caching over the paged KV blocks (vLLM v1's design, block-granular).

Every *full* prompt block gets a hash chained on the block before it, so two requests share a
block only if their whole prefixes up to it match. A computed full block is registered under
its hash; a later request whose prompt starts with the same chain reuses those blocks (their
reference count goes up) and starts ``num_computed_tokens`` at the cached length, skipping that
part of its prefill. When nobody references a cached block it stays cached but evictable: an
LRU list of such blocks is counted as free, and a block is evicted (its hash forgotten) only
when the free list of never-cached blocks is empty.

Requests carry no token ids, so block contents are named by ``Request.hash_ids``: ids of
``hash_block_tokens``-token prompt blocks (Mooncake traces: 512). The engine block ``i``
(positions ``[i*bs, (i+1)*bs)``) is named by the ids of the trace blocks it overlaps and its
position in them, chained on block ``i-1``'s hash. A request without ``hash_ids`` shares
nothing. As in vLLM, at least the last prompt token is always recomputed (it yields the logits),
so the cached length is at most ``prompt_len - 1`` rounded down to whole blocks.

The plain :class:`~sim.core.blocks.BlockManager` stays the no-caching path, untouched and fast.
"""

from __future__ import annotations

from collections import OrderedDict

from sim.core.blocks import BlockManager
from sim.core.request import Request

HASHES = "block_hashes"  # Request.extra key: the chained hashes of its full prompt blocks
REGISTERED = "cached_upto"  # Request.extra key: blocks of its table already registered


def chained_block_hashes(hash_ids: tuple[int, ...], prompt_len: int, block_size: int,
                         hash_block_tokens: int) -> list[int]:
    """Hashes of the full ``block_size`` blocks of a prompt named by ``hash_ids``."""
    out: list[int] = []
    prev = 0
    n_ids = len(hash_ids)
    for i in range(prompt_len // block_size):
        lo = i * block_size
        hi = lo + block_size - 1
        k0 = lo // hash_block_tokens
        k1 = hi // hash_block_tokens
        if k1 >= n_ids:
            break
        if k0 == k1:
            # the common case (block_size divides the trace block): one id, an offset in it
            prev = hash((prev, hash_ids[k1], lo - k1 * hash_block_tokens))
        else:
            prev = hash((prev, hash_ids[k0:k1 + 1], lo - k0 * hash_block_tokens))
        out.append(prev)
    return out


class PrefixCachingBlockManager(BlockManager):
    """A BlockManager whose full prompt blocks are shared through a hash-chained cache."""

    caches_prefixes = True

    def __init__(self, num_blocks: int, block_size: int, hash_block_tokens: int = 512) -> None:
        super().__init__(num_blocks, block_size)
        self.hash_block_tokens = hash_block_tokens
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # hash -> block id
        # Unreferenced cached blocks, least recently used first: free, but evicted last.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    # -- capacity -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free) - len(self._evictable)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    def can_allocate(self, req: Request, total_tokens: int, spare: int = 0) -> bool:
        return self.blocks_needed(req, total_tokens) + spare <= self.num_free

    def _take_free_block(self) -> int:
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._evictable.popitem(last=False)
            del self.cached[self.block_hash[block]]
            self.block_hash[block] = None
            self.evictions += 1
        self.ref_count[block] = 1
        return block

    def allocate(self, req: Request, total_tokens: int) -> bool:
        need = self.blocks_needed(req, total_tokens)
        if need > len(self._free) + len(self._evictable):
            return False
        table = req.block_table
        for _ in range(need):
            table.append(self._take_free_block())
        return True

    def free(self, req: Request) -> None:
        table = req.block_table
        if not table:
            return
        ref = self.ref_count
        block_hash = self.block_hash
        # Reverse order, as vLLM: a prompt's tail blocks are evicted before its head.
        for block in reversed(table):
            ref[block] -= 1
            if ref[block] == 0:
                if block_hash[block] is None:
                    self._free.append(block)
                else:
                    self._evictable[block] = None
        req.block_table = []
        if req.extra is not None:
            req.extra[REGISTERED] = 0

    # -- the cache ------------------------------------------------------------------------
    def block_hashes(self, req: Request) -> list[int]:
        extra = req.extra
        if extra is None:
            extra = req.extra = {}
        hashes = extra.get(HASHES)
        if hashes is None:
            hashes = extra[HASHES] = (
                chained_block_hashes(req.hash_ids, req.prompt_len, self.block_size,
                                     self.hash_block_tokens)
                if req.hash_ids else []
            )
        return hashes

    def match_prefix(self, req: Request) -> int:
        """Tokens of ``req``'s prompt held in cached blocks (whole blocks, < prompt_len)."""
        if not req.hash_ids:
            return 0
        hashes = self.block_hashes(req)
        limit = min(len(hashes), (req.prompt_len - 1) // self.block_size)
        cached = self.cached
        n = 0
        while n < limit and hashes[n] in cached:
            n += 1
        return n * self.block_size

    def allocate_cached(self, req: Request, total_tokens: int, cached_tokens: int) -> bool:
        """Give a blockless ``req`` the cached blocks of its first ``cached_tokens`` positions
        (just matched by ``match_prefix``) and fresh blocks up to ``total_tokens``."""
        assert not req.block_table and cached_tokens % self.block_size == 0
        hashes = self.block_hashes(req)
        nb = cached_tokens // self.block_size
        matched = [self.cached[h] for h in hashes[:nb]]
        ref = self.ref_count
        revived = sum(1 for b in matched if ref[b] == 0)
        need = -(-total_tokens // self.block_size) - nb
        if need > len(self._free) + len(self._evictable) - revived:
            return False
        for b in matched:
            if ref[b] == 0:
                del self._evictable[b]
            ref[b] += 1
        req.block_table = matched
        req.extra[REGISTERED] = nb
        for _ in range(need):
            matched.append(self._take_free_block())
        return True

    def cache_blocks(self, req: Request) -> None:
        """Register ``req``'s prompt blocks that became full and computed (after a step)."""
        if not req.hash_ids:
            return
        extra = req.extra
        done = extra.get(REGISTERED, 0) if extra is not None else 0
        full = min(req.num_computed_tokens, req.prompt_len) // self.block_size
        if full <= done:
            return
        hashes = self.block_hashes(req)
        full = min(full, len(hashes))
        table = req.block_table
        cached = self.cached
        block_hash = self.block_hash
        for i in range(done, full):
            h = hashes[i]
            block = table[i]
            if h not in cached and block_hash[block] is None:
                cached[h] = block
                block_hash[block] = h
        req.extra[REGISTERED] = full

    def check(self) -> None:
        """Assert the bookkeeping is consistent (tests)."""
        free = set(self._free)
        evictable = set(self._evictable)
        assert not free & evictable
        for b in range(self.num_blocks):
            if b in free:
                assert self.ref_count[b] == 0 and self.block_hash[b] is None, b
            elif b in evictable:
                assert self.ref_count[b] == 0 and self.block_hash[b] is not None, b
            else:
                assert self.ref_count[b] > 0, b
        for h, b in self.cached.items():
            assert self.block_hash[b] == h
