"""Prefix-cache registration: a decoding sequence's blocks are hashed once each, with the same result as
hashing every full block on every call."""

from blockdraft.cache.block_manager import BlockManager

PAGE = 4


class Counting(BlockManager):
    """Counts the blocks `register` hashes."""

    hashed = 0

    def _chain(self, tokens, n, first=0, parent=0):
        for item in super()._chain(tokens, n, first, parent):
            self.hashed += 1
            yield item


def test_registering_step_by_step_hashes_each_block_once_and_matches_one_call():
    tokens = list(range(100, 141))                                   # 41 tokens: 10 full blocks
    stepwise, whole = Counting(16, PAGE), Counting(16, PAGE)
    tables = {m: [] for m in (stepwise, whole)}
    for m, table in tables.items():
        assert m.allocate(table, len(tokens))
    done = (0, 0)
    for committed in range(1, len(tokens) + 1):                      # one token a step, as decoding commits
        done = stepwise.register(tables[stepwise], tokens, committed, done)
    whole.register(tables[whole], tokens, len(tokens))
    assert done[0] == 10 and stepwise.hashed == 10 == whole.hashed
    assert stepwise.block_key == whole.block_key and stepwise.by_hash == whole.by_hash
    assert stepwise.match_prefix(tokens) == tables[stepwise][:10]


def test_a_block_whose_content_another_holds_is_looked_at_again_until_it_holds_it():
    """Two tables with the same tokens: the second's block stays unregistered while the first's holds the
    hash, and is registered once that block is reallocated, as a walk over every block would."""
    tokens = list(range(8))                                          # 2 full blocks
    m = BlockManager(4, PAGE)
    a, b = [], []
    assert m.allocate(a, 8) and m.allocate(b, 8)
    m.register(a, tokens, 8)
    done = m.register(b, tokens, 8)
    assert done == (0, 0) and m.block_key[b[0]] is None              # a holds both hashes
    assert m.register(b, tokens, 8, done) == (0, 0)
    m.release(a)                                                     # a's blocks free (still hit-able) ...
    m.allocate([], 8)                                                # ... and reallocated: their entries go
    done = m.register(b, tokens, 8, done)
    assert done[0] == 2 and m.match_prefix(tokens) == b
