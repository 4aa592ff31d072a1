"""Block tables, reference counts and prefix caching for the paged KV pools.

A sequence owns a list of block ids (its `block_table`); position p lives in slot
`block_table[p // page_size] * page_size + p % page_size`. Allocation grows a
table to cover `k + 1` new tokens per verify step; rejected drafts stay in the
sequence's own blocks and are simply overwritten (write-by-position).

Prefix caching: a *full, committed* block is registered under a hash chained over
its token ids; another sequence with the same prefix shares it (ref-counted).
Shared blocks are immutable: a sequence only ever writes at positions at or
beyond its committed length, which lie in blocks it owns alone, so divergence
allocates a fresh block (copy-on-write at block granularity, nothing to copy).
Hits are verified against the stored ids, and a freed block keeps its contents
for later hits until it is reallocated, when its hash entry is dropped (so no
stale ids are ever matched). The drafter pool mirrors block ids, so a hit shares
the drafter's context for that prefix too.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockManager:
    def __init__(self, num_blocks: int, page_size: int, prefix_caching: bool = True):
        self.num_blocks, self.page_size = num_blocks, page_size
        self.prefix_caching = prefix_caching
        self.ref = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # LRU order
        self.block_key: list[tuple | None] = [None] * num_blocks  # (hash, token ids) of a registered block
        self.by_hash: dict[int, int] = {}
        self.hits = 0           # blocks reused from the prefix cache
        self.queries = 0        # full blocks looked up

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def _take(self) -> int:
        block, _ = self.free.popitem(last=False)
        key = self.block_key[block]
        if key is not None:  # reallocated: its old contents are gone, forget them
            if self.by_hash.get(key[0]) == block:
                del self.by_hash[key[0]]
            self.block_key[block] = None
        self.ref[block] = 1
        return block

    def _share(self, block: int) -> None:
        if self.ref[block] == 0:
            del self.free[block]
        self.ref[block] += 1

    def _chain(self, tokens: list[int], n: int, first: int = 0, parent: int = 0):
        """(index, hash chained over the blocks so far, token ids) of full blocks first..n-1 of `tokens`
        (`parent`: the chained hash of the blocks before `first`)."""
        for i in range(first, n):
            ids = tuple(tokens[i * self.page_size:(i + 1) * self.page_size])
            parent = hash((parent, ids))
            yield i, parent, ids

    def match_prefix(self, tokens: list[int]) -> list[int]:
        """Cached blocks covering a prefix of `tokens` (full blocks only, verified against stored ids)."""
        if not self.prefix_caching:
            return []
        blocks = []
        for _, key, ids in self._chain(tokens, len(tokens) // self.page_size):
            self.queries += 1
            block = self.by_hash.get(key)
            if block is None or self.block_key[block] != (key, ids):
                break
            blocks.append(block)
        return blocks

    def allocate(self, table: list[int], tokens: int, reuse: list[int] = ()) -> bool:
        """Grow `table` to cover `tokens` positions, first sharing `reuse` blocks. False if out of blocks."""
        need = self.blocks_for(tokens) - len(table) - len(reuse)
        reusable_free = sum(1 for b in reuse if self.ref[b] == 0)
        if need > self.num_free - reusable_free:
            return False
        for b in reuse:
            self._share(b)
            self.hits += 1
        table.extend(reuse)
        table.extend(self._take() for _ in range(max(0, need)))
        return True

    def register(self, table: list[int], tokens: list[int], committed: int,
                 done: tuple[int, int] = (0, 0)) -> tuple[int, int]:
        """Make the full blocks among the first `committed` tokens available for prefix hits. `done` is what
        the last call for this table returned: its first blocks that hold their own hash entry, and their
        chained hash; those are not hashed again (a decoding sequence registers each block once, not every
        block every step). Returns the same for the next call."""
        if not self.prefix_caching:
            return done
        for i, key, ids in self._chain(tokens, committed // self.page_size, *done):
            block = table[i]
            if self.block_key[block] is None and key not in self.by_hash:
                self.block_key[block] = (key, ids)
                self.by_hash[key] = block
            if done[0] == i and self.block_key[block] == (key, ids):
                done = (i + 1, key)
        return done

    def release(self, table: list[int]) -> None:
        """Drop a sequence's references; unreferenced blocks return to the free pool (still hit-able)."""
        for block in reversed(table):
            self.ref[block] -= 1
            if self.ref[block] < 0:
                raise RuntimeError(f"block {block} released twice")
            if self.ref[block] == 0:
                self.free[block] = None
        table.clear()
