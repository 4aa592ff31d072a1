"""A paged step's bookkeeping against the rule it implements, spelled out position by position."""

import pytest
import torch

from blockdraft.cache.paged import PagedKVPool, PagedStep, pad_tables
from blockdraft.cache.views import causal_visibility

PAGE = 4


def slot(table: list[int], position: int) -> int:
    return table[position // PAGE] * PAGE + position % PAGE


@pytest.mark.parametrize("starts, counts", [([9], [1]), ([0, 0], [9, 6]), ([5, 11, 2], [3, 1, 3]), ([7, 7], [2, 2])])
def test_paged_step_matches_the_block_tables_position_by_position(starts, counts):
    tables = [[3, 1, 5, 0], [2, 6, 4, 7], [8, 9]][:len(starts)]
    pool = PagedKVPool([0], num_blocks=10, page_size=PAGE, num_kv_heads=1, head_dim=16, dtype=torch.bfloat16)
    step = PagedStep(pool, pad_tables(tables), starts, counts)
    t, end = max(counts), max(s + c for s, c in zip(starts, counts))
    valid = [[i < c for i in range(t)] for c in counts]
    positions = [[s + i if i < c else 0 for i in range(t)] for s, c in zip(starts, counts)]
    assert step.valid.tolist() == valid and step.positions.tolist() == positions
    assert step.write_slots.tolist() == [slot(tb, p) for tb, row, ok in zip(tables, positions, valid)
                                         for p, real in zip(row, ok) if real]
    padded = [tb + [0] * (max(map(len, tables)) - len(tb)) for tb in tables]
    assert step.read_slots.tolist() == [slot(tb, p) for tb in padded for p in range(end)]
    assert step.visible.shape == (len(starts), 1, t, end)
    assert step.visible[:, 0].tolist() == [[[k <= q for k in range(end)] for q in row] for row in positions]
    kv = step.kernel_kv()
    write = [slot(tb, p) if real else -1 for tb, row, ok in zip(tables, positions, valid) for p, real in zip(row, ok)]
    assert kv.write_slots.tolist() == write and kv.read_slots.shape == (len(starts), end)
    every_key = t == 1 and len(set(starts)) == 1                  # decoding rows at one length: no mask
    assert kv.visible is None if every_key else kv.visible is step.visible
    assert list(kv.pointers[0]) == [pool.k[0].data_ptr()] and list(kv.pointers[1]) == [pool.v[0].data_ptr()]


@pytest.mark.parametrize("window, causal", [(None, True), (3, True), (None, False), (3, False)])
@pytest.mark.parametrize("shared_keys", [True, False])
def test_causal_visibility_is_the_rule_by_position(window, causal, shared_keys):
    q_pos = torch.tensor([[4, 5, 6], [0, 1, 2]])
    k_pos = torch.arange(8)[None] if shared_keys else torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1, 0]])
    keys = k_pos.expand(2, 8).tolist()

    def sees(q: int, k: int) -> bool:
        return (not causal or k <= q) and (window is None or abs(q - k) < window)

    want = [[[sees(q, k) for k in keys[b]] for q in row] for b, row in enumerate(q_pos.tolist())]
    assert causal_visibility(q_pos, k_pos, window, causal)[:, 0].tolist() == want


def test_a_slot_row_keeps_the_block_tables_slots_as_the_sequence_grows():
    """A decoding sequence's kept slots equal the block table's, position by position, as it grows past pages
    and past the row's capacity, and are read anew when the table no longer starts with the same blocks."""
    from blockdraft.cache.paged import SlotRow
    row, table = SlotRow(PAGE), [3, 1]
    row.sync(table, 6)
    for end in range(7, 700):
        if end > PAGE * len(table):
            table.append(len(table) + 3)
        row.sync(table, end)
        assert row.end == end and row.slots[end - 1].item() == slot(table, end - 1)
    assert row.slots[:699].tolist() == [slot(table, p) for p in range(699)]
    pool = PagedKVPool([0, 1], num_blocks=200, page_size=PAGE, num_kv_heads=2, head_dim=16, dtype=torch.bfloat16)
    kv = pool.row_kv(row, 698)
    assert (kv.write, kv.read, kv.keys) == (row.slots.data_ptr() + 8 * 698, row.slots.data_ptr(), 699)
    assert (kv.slot_stride, kv.head_stride) == (32, 16) and kv.pointers is pool.pointers()
    again = [7, 8]                                      # released and allocated again
    row.sync(again, 5)
    assert row.slots[:5].tolist() == [slot(again, p) for p in range(5)]
