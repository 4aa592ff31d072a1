"""A step that raises inside the engine: its requests end with an error, the server keeps serving.

The failed requests leave the engine (`abort_all`) with their blocks back in the pool, so the engine
does not step the same broken batch again, and later requests are served normally.
"""

import httpx
import pytest
from openai import APIStatusError, OpenAI

from blockdraft.llm import LLM, TINY_ASSETS
from blockdraft.server.thread import ServerThread
from server_harness import API_KEY, MODEL


@pytest.fixture(scope="module")
def faulty():
    llm = LLM(target=TINY_ASSETS / "target-qwen3", drafter=TINY_ASSETS / "dspark", max_batch=4)
    runner = llm.engine.runner
    real = runner.decode
    state = {"fail": 0, "calls": 0}

    def decode(*args, **kwargs):
        state["calls"] += 1
        if state["fail"] > 0:
            state["fail"] -= 1
            raise RuntimeError("injected kernel failure")
        return real(*args, **kwargs)

    runner.decode = decode
    with ServerThread(llm, MODEL, API_KEY) as srv:
        yield srv, llm, state


def test_failed_step_is_an_error_then_the_next_request_is_served(faulty):
    srv, llm, state = faulty
    client = OpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY, max_retries=0)
    ok = client.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0)
    state["fail"] = 1
    with pytest.raises(APIStatusError) as e:
        client.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0)
    assert e.value.status_code == 500 and "injected kernel failure" in str(e.value)
    # the 500 is sent after abort_all: with nothing unfinished the driver parks on its wakeup event
    assert not llm.engine.has_unfinished(), "the failed requests stayed in the engine, which keeps stepping them"
    assert llm.engine.blocks.num_free == llm.engine.plan.num_blocks and not llm.engine.seqs
    again = client.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0)
    assert again.choices[0].text == ok.choices[0].text
    assert httpx.get(f"{srv.url}/health").status_code == 200


def test_failed_step_ends_a_stream_with_an_error_event(faulty):
    srv, llm, state = faulty
    state["fail"] = 1
    with httpx.stream("POST", f"{srv.url}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                      json={"model": "tiny", "prompt": "Hi", "max_tokens": 30, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert any("injected kernel failure" in e and '"error"' in e for e in events)
    assert llm.engine.blocks.num_free == llm.engine.plan.num_blocks and not llm.engine.seqs
