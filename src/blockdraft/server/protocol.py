"""OpenAI request validation: every bad field becomes an `ApiError` naming it, before admission.

Nothing is silently ignored: a field OpenAI defines that would change the output and is not
implemented here (logprobs, penalties, tools, ...) is refused by name unless it holds its
neutral value, and a field OpenAI does not define is refused as OpenAI refuses it.
"""

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


# implemented, or informational (they change nothing the model computes)
FIELDS = frozenset({"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                    "stream", "stream_options", "ignore_eos", "n", "user", "metadata", "store", "service_tier",
                    "parallel_tool_calls"})
ENDPOINT_FIELDS = {False: frozenset({"prompt"}), True: frozenset({"messages"})}
# not implemented: accepted only at a neutral value (compared with its type: logprobs 0 is not False)
NEUTRAL = {"logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "suffix": ("",), "best_of": (1,),
           "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
           "logit_bias": ({},), "response_format": ({"type": "text"},), "tools": ([],), "functions": ([],),
           "tool_choice": ("none", "auto"), "function_call": ("none", "auto"), "min_tokens": (0,),
           "min_p": (0, 0.0), "stop_token_ids": ([],), "modalities": (["text"],), "prediction": (),
           "audio": (), "reasoning_effort": (), "web_search_options": ()}


def check_fields(body: dict, chat: bool) -> None:
    """Refuse, by name, every field this server would otherwise ignore."""
    for name, value in body.items():
        if name in NEUTRAL:
            if value is not None and not any(type(value) is type(v) and value == v for v in NEUTRAL[name]):
                raise ApiError(400, f"'{name}' is not supported by this server (got {value!r}); "
                               "omit it or send its neutral value", name)
        elif name not in FIELDS and name not in ENDPOINT_FIELDS[chat]:
            raise ApiError(400, f"Unrecognized request argument supplied: {name}", name)


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
        if isinstance(m["content"], list):  # OpenAI content parts: text only
            kinds = [p.get("type") if isinstance(p, dict) else type(p).__name__ for p in m["content"]]
            if any(k != "text" for k in kinds):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported, got {kinds}", "messages")
            m = dict(m, content="".join(p.get("text", "") for p in m["content"]))
            messages[i] = m
        elif not isinstance(m["content"], str):
            raise ApiError(400, f"messages[{i}].content must be a string", "messages")
    return messages
