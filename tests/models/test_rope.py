"""Rotary cos/sin against transformers' spelling of them, bit for bit."""

import pytest
import torch

from blockdraft.config import RopeConfig
from blockdraft.layers.rope import Rotary, apply_rope
from conftest import on_threads


def hf_cos_sin(rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype):
    """transformers' rotary embedding: emb = cat(freqs, freqs), cos/sin times the attention scaling."""
    freqs = positions.float()[..., None] * rotary.inv_freq[None, None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * rotary.scaling).to(dtype), (emb.sin() * rotary.scaling).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@pytest.mark.parametrize("rope", [RopeConfig(), RopeConfig(theta=1e6, rope_type="yarn", factor=4.0),
                                  RopeConfig(rope_type="llama3", factor=8.0)], ids=["default", "yarn", "llama3"])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cos_sin_and_the_rotation_are_transformers_bits(rope, head_dim, dtype):
    rotary = Rotary(rope, head_dim)
    positions = torch.tensor([[0, 1, 2, 4095], [17, 300, 301, 302]])
    cos, sin = rotary.cos_sin(positions, dtype)                                 # [2, 1, 4, head_dim]
    want_cos, want_sin = hf_cos_sin(rotary, positions, dtype)
    half = head_dim // 2
    assert torch.equal(cos[:, 0], want_cos)
    assert torch.equal(sin[:, 0, ..., :half], -want_sin[..., :half])
    assert torch.equal(sin[:, 0, ..., half:], want_sin[..., half:])
    x = torch.randn(2, 3, 4, head_dim, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert torch.equal(apply_rope(x, cos, sin), x * want_cos[:, None] + rotate_half(x) * want_sin[:, None])


@pytest.mark.parametrize("rope", [RopeConfig(), RopeConfig(theta=1e6, rope_type="yarn", factor=4.0),
                                  RopeConfig(rope_type="llama3", factor=8.0)], ids=["default", "yarn", "llama3"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("threads", [1, 3])
def test_the_rotary_table_holds_the_one_row_bits_of_every_position(rope, head_dim, threads):
    """Row p of the table (grown as positions come) is what `cos_sin` gives a one-row step at p, bit for bit."""
    rotary = Rotary(rope, head_dim)
    cos, sin = on_threads(threads, lambda: rotary.table(300, torch.bfloat16))
    assert cos.shape[0] >= 300
    grown = on_threads(threads, lambda: rotary.table(cos.shape[0] + 1000, torch.bfloat16))
    assert torch.equal(grown[0][:cos.shape[0]], cos)
    for p in [*range(0, 1100, 7), grown[0].shape[0] - 1]:
        one_cos, one_sin = rotary.cos_sin(torch.tensor([[p]]), torch.bfloat16)
        assert torch.equal(grown[0][p], one_cos[0, 0, 0]) and torch.equal(grown[1][p], one_sin[0, 0, 0]), p


def test_no_rotary_table_where_a_longer_call_could_round_otherwise():
    assert Rotary(RopeConfig(), 80).table(10, torch.bfloat16) is None
