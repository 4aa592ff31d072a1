"""A drafter trained with its own Markov rank and MLP width publishes and loads with that shape."""

import torch

from blockdraft.checkpoints.publish import new_drafter, save_drafter
from blockdraft.loading import load_drafter


def test_markov_rank_and_mlp_width_survive_publishing(target, tmp_path):
    width = 2 * target.config.intermediate_size
    drafter = new_drafter(target, "dspark", 1, 4, (0, 3), 1, markov_rank=8, intermediate_size=width)
    assert drafter.config.intermediate_size == width and drafter.config.heads.markov_rank == 8
    loaded = load_drafter(save_drafter(drafter, target, tmp_path / "d"), target)
    assert loaded.config.intermediate_size == width and loaded.config.heads.markov_rank == 8
    want, got = drafter.state_dict(), loaded.state_dict()      # published in bf16
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k].to(torch.bfloat16).to(got[k].dtype), got[k]) for k in want if want[k].is_floating_point())


def test_default_mlp_width_is_the_targets(target):
    assert new_drafter(target, "dspark", 1, 4, (0, 3), 1).config.intermediate_size == target.config.intermediate_size
