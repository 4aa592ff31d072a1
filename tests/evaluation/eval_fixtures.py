"""Evaluation tests run torch on one thread (the default model's runs are the heavy part), and share
one load of the default model with its shipped drafters."""

import pytest
import torch

from conftest import on_threads


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def default_llm():
    from blockdraft.llm import LLM

    return on_threads(1, lambda: LLM(drafter="dspark", max_batch=1, max_model_len=64, adaptive_speculation=False))
