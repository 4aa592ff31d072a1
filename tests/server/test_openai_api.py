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


def _metrics(server) -> dict:
    """{(sample name, labels): value} from /metrics."""
    text = httpx.get(f"{server.url}/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_values_follow_the_requests(server, client):
    """Each family is there and moves by what the requests did (deltas: the server is shared)."""
    before = _metrics(server)
    outs = [client.completions.create(model="tiny", prompt=p, max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True}) for p in ("metrics", "more metrics")]
    after = _metrics(server)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    lengths = [a for o in outs for a in o.model_extra["blockdraft"]["acceptance_lengths"]]
    assert delta("blockdraft_requests_total", endpoint="/v1/completions", status="200") == 2
    assert delta("blockdraft_generated_tokens_total") == sum(o.usage.completion_tokens for o in outs) == 20
    assert delta("blockdraft_acceptance_length_count") == len(lengths) and max(lengths) > 1
    assert delta("blockdraft_acceptance_length_sum") == sum(lengths)
    assert delta("blockdraft_request_latency_seconds_count") == 2
    assert delta("blockdraft_time_to_first_token_seconds_count") == 2
    engine = server.llm.engine
    gauges = {name: after[(name, ())] for name in ("blockdraft_requests_running", "blockdraft_requests_waiting",
                                                   "blockdraft_cache_blocks_used", "blockdraft_cache_blocks_free",
                                                   "blockdraft_mean_acceptance_length")}
    assert gauges["blockdraft_requests_running"] == gauges["blockdraft_requests_waiting"] == 0
    assert gauges["blockdraft_cache_blocks_free"] + gauges["blockdraft_cache_blocks_used"] == engine.plan.num_blocks
    assert gauges["blockdraft_cache_blocks_free"] == engine.blocks.num_free > 0
    assert gauges["blockdraft_mean_acceptance_length"] == pytest.approx(engine.stats.spec.mean_acceptance_length)
    rates = engine.stats.spec.per_position_acceptance()
    assert [after[("blockdraft_position_acceptance_rate", (("position", str(i)),))] for i in range(len(rates))] \
        == pytest.approx(rates) and rates[0] > 0


REFUSED = [  # (endpoint, field, value): fields that would change the output and are not implemented
    ("completions", "logprobs", 1), ("completions", "logprobs", 0), ("completions", "echo", True),
    ("completions", "suffix", "x"), ("completions", "best_of", 2), ("completions", "presence_penalty", 0.5),
    ("completions", "frequency_penalty", -1), ("completions", "logit_bias", {"5": 100}), ("completions", "n", 2),
    ("chat", "logprobs", True), ("chat", "top_logprobs", 2), ("chat", "response_format", {"type": "json_object"}),
    ("chat", "tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("chat", "tool_choice", "required"), ("chat", "functions", [{"name": "f", "parameters": {}}]),
    ("chat", "presence_penalty", 1.0), ("chat", "frequency_penalty", 0.1), ("chat", "frobnicate", 1),
]


def _create(client, endpoint: str, **fields):
    if endpoint == "chat":
        return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=3, **fields)
    return client.completions.create(model="tiny", prompt="hi", max_tokens=3, **fields)


@pytest.mark.parametrize("endpoint,field,value", REFUSED, ids=[f"{e}-{f}-{v}" for e, f, v in REFUSED])
def test_unimplemented_fields_are_refused_by_name(server, client, endpoint, field, value):
    from openai import BadRequestError

    known = {"logprobs", "echo", "suffix", "best_of", "presence_penalty", "frequency_penalty", "logit_bias", "n",
             "top_logprobs", "response_format", "tools", "tool_choice", "functions"}
    with pytest.raises(BadRequestError) as e:
        _create(client, endpoint, **({field: value} if field in known else {"extra_body": {field: value}}))
    assert e.value.status_code == 400 and e.value.param == field and field in e.value.message
    assert server.llm.engine.blocks.num_free == server.llm.engine.plan.num_blocks   # nothing admitted


def test_neutral_values_of_unimplemented_fields_are_accepted(client):
    plain = _create(client, "completions", temperature=0)
    neutral = _create(client, "completions", temperature=0, logprobs=None, echo=False, presence_penalty=0,
                      frequency_penalty=0.0, logit_bias={}, best_of=1, n=1, suffix=None, user="u")
    assert neutral.choices[0].text == plain.choices[0].text
    chat = _create(client, "chat", temperature=0, logprobs=False, presence_penalty=0, tools=[],
                   response_format={"type": "text"}, tool_choice="none")
    assert chat.choices[0].finish_reason in ("stop", "length")


def test_non_text_content_parts_are_refused_not_dropped(client):
    from openai import BadRequestError

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(model="tiny", max_tokens=3, messages=[
            {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}])
    assert e.value.param == "messages" and "image_url" in e.value.message


def test_startup_line_says_what_is_served(server):
    from blockdraft.server.app import startup_line

    line = startup_line(server.llm, "127.0.0.1", 8000)
    assert "\n" not in line
    for part in ("http://127.0.0.1:8000/v1", "target-qwen3", "drafter dspark", "bfloat16", "device cpu",
                 "max batch 8", "cache ", "MiB", "context 512"):
        assert part in line, (part, line)
