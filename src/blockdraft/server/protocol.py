"""OpenAI request validation: every bad field becomes an `ApiError` naming it, before admission."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BlockdraftError
from ..sampling.params import SamplingParams


@dataclass
class ApiError(Exception):
    status: int
    message: str
    param: str | None = None
    type: str = "invalid_request_error"
    code: str | None = None

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _number(body: dict, name: str, default, kind=(int, float)):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ApiError(400, f"'{name}' must be a number, got {value!r}", name)
    return value


def sampling_params(body: dict, default_max_tokens: int) -> SamplingParams:
    n = _number(body, "n", 1, int)
    if n != 1:
        raise ApiError(400, f"only n=1 is supported, got n={n}", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = default_max_tokens if max_tokens is None else max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise ApiError(400, f"'max_tokens' must be a positive integer, got {max_tokens!r}", "max_tokens")
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise ApiError(400, f"'temperature' must be >= 0, got {temperature}", "temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise ApiError(400, f"'top_p' must be in (0, 1], got {top_p}", "top_p")
    top_k = _number(body, "top_k", 0, int)
    if top_k < 0:
        raise ApiError(400, f"'top_k' must be >= 0 (0 = off), got {top_k}", "top_k")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"'seed' must be an integer, got {seed!r}", "seed")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise ApiError(400, f"'stop' must be a non-empty string or a list of them, got {stop!r}", "stop")
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                              top_k=top_k, seed=seed, stop=stop or None,
                              ignore_eos=bool(body.get("ignore_eos", False)))
    except BlockdraftError as e:
        raise ApiError(400, str(e)) from None


def completion_prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise ApiError(400, "'prompt' must be a non-empty string or list of token ids (one prompt per request)",
                   "prompt")


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' is required: a non-empty list of {role, content}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ApiError(400, f"messages[{i}] must have a 'role' and a 'content'", "messages")
        if isinstance(m["content"], list):  # OpenAI content parts: keep the text ones
            m = dict(m, content="".join(p.get("text", "") for p in m["content"] if isinstance(p, dict)))
            messages[i] = m
        elif not isinstance(m["content"], str):
            raise ApiError(400, f"messages[{i}].content must be a string", "messages")
    return messages
