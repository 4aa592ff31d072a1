"""The server through the official `openai` client, raw HTTP for bad requests, and /metrics."""

import json

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from blockdraft.cli import main
from conftest import ASSETS

TINY_DSPARK = ["--target", str(ASSETS / "target-qwen3"), "--drafter", str(ASSETS / "dspark"),
               "--no-adaptive-speculation"]        # the harness server drafts every step too
from server_harness import API_KEY, server  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def cli_tokens(capsys, *args):
    assert main(["generate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_completion_matches_cli_generate(client, capsys):
    r = client.completions.create(model="tiny", prompt="Hello there", max_tokens=20, temperature=0)
    ref = cli_tokens(capsys, "--prompt", "Hello there", "--max-new-tokens", "20", *TINY_DSPARK)
    assert r.choices[0].text == ref["text"]
    assert r.usage.completion_tokens == len(ref["token_ids"])
    assert r.usage.prompt_tokens == len("Hello there")          # character-level tokenizer
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    stats = r.model_extra["blockdraft"]
    assert stats["acceptance_lengths"] == ref["acceptance_lengths"]
    assert stats["drafted"] >= stats["accepted"] > 0


def test_chat_matches_cli_chat(client, capsys):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12,
                                       temperature=0)
    ref = cli_tokens(capsys, "--prompt", "hi", "--chat", "--max-new-tokens", "12", *TINY_DSPARK)
    assert r.choices[0].message.content == ref["text"] and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == len(ref["token_ids"])


def test_streaming_completion_and_chat_equal_non_streaming(client):
    full = client.completions.create(model="tiny", prompt="abc", max_tokens=25, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt="abc", max_tokens=25, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=9,
                                          temperature=0)
    pieces = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                            max_tokens=9, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in pieces) == chat.choices[0].message.content


def test_stop_string_and_seeded_sampling(client):
    more = {"ignore_eos": True}
    full = client.completions.create(model="tiny", prompt="abc", max_tokens=30, temperature=0,
                                     extra_body=more).choices[0].text
    stop = full[10:12]
    assert len(stop) == 2
    cut = client.completions.create(model="tiny", prompt="abc", max_tokens=30, temperature=0, stop=[stop],
                                    extra_body=more)
    assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].text
    assert full.startswith(cut.choices[0].text)
    streamed = client.completions.create(model="tiny", prompt="abc", max_tokens=30, temperature=0, stop=[stop],
                                         stream=True, extra_body=more)
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text
    a = client.completions.create(model="tiny", prompt="abc", max_tokens=15, temperature=0.8, seed=5)
    b = client.completions.create(model="tiny", prompt="abc", max_tokens=15, temperature=0.8, seed=5)
    assert a.choices[0].text == b.choices[0].text


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


BAD = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"prompt": "x"}, 400, "model"),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"model": "tiny", "prompt": "x" * 600, "max_tokens": 5}, 400, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "prompt"),
]


@pytest.mark.parametrize("path,body,status,param", BAD, ids=[f"{b[2]}-{b[3]}-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}{path}", content=content, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    assert server.llm.engine.blocks.num_free == server.llm.engine.plan.num_blocks   # nothing admitted


def test_wrong_api_key_is_401(server):
    bad = OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(Exception) as err:
        bad.completions.create(model="tiny", prompt="x", max_tokens=2)
    assert getattr(err.value, "status_code", None) == 401


def test_metrics_parse_and_families(server, client):
    client.completions.create(model="tiny", prompt="metrics", max_tokens=10, temperature=0)
    text = httpx.get(f"{server.url}/metrics").text
    families = {f.name for f in text_string_to_metric_families(text)}
    for name in ("blockdraft_requests", "blockdraft_request_latency_seconds", "blockdraft_time_to_first_token_seconds",
                 "blockdraft_generated_tokens", "blockdraft_acceptance_length", "blockdraft_position_acceptance_rate",
                 "blockdraft_requests_running", "blockdraft_requests_waiting", "blockdraft_cache_blocks_used",
                 "blockdraft_cache_blocks_free"):
        assert name in families, name
