"""Text ↔ ids with HF `tokenizer.json` (the `tokenizers` library) and jinja2 chat templates.

Raw prompts are encoded with the tokenizer's own special-token rules (its
post-processor decides about BOS); chat prompts are rendered with the
`chat_template` of `tokenizer_config.json` and encoded without adding specials,
as transformers' `apply_chat_template` does.
"""

from __future__ import annotations

import json
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer

from .errors import CheckpointError, RequestError


def _raise(message: str):
    raise TemplateError(message)


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"missing file: {path} (blockdraft needs a tokenizer.json for text prompts)")
        self._tok = _HFTokenizer.from_file(str(path))
        cfg_path = model_dir / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.chat_template = self.config.get("chat_template")
        tpl = model_dir / "chat_template.jinja"
        if self.chat_template is None and tpl.is_file():
            self.chat_template = tpl.read_text()
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_prompt(self, text: str, chat: bool = False) -> list[int]:
        """A prompt's ids: as is, or (chat) as one user message in the chat template."""
        return self.encode_chat([{"role": "user", "content": text}]) if chat else self.encode(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise RequestError("this tokenizer has no chat_template; send a raw prompt instead")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise RequestError(f"messages[{i}] must be an object with 'role' and 'content', got {m!r}")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError as e:
            raise RequestError(f"chat template rejected the messages: {e}") from None

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)


def _token_text(tok) -> str | None:
    if isinstance(tok, dict):  # AddedToken serialised as {"content": ...}
        return tok.get("content")
    return tok


BACK = 8    # tokens before the newest a stream decodes again with them (what they change of the text before)


class TextStream:
    """Incremental detokenisation that never emits a stop string, even one split across steps. A step
    decodes only the last tokens: the text of ids[:n] is kept, and the text of ids[:m] (m > n) is that
    text with the text of ids[n - BACK:n] at its end replaced by the text of ids[n - BACK:m]; where the kept
    text does not end with the former (a window that starts inside a character) or the ids did not grow,
    the whole text is decoded again."""

    def __init__(self, decode, stops):
        self.decode, self.stops, self.sent = decode, stops or (), ""
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.count, self.last, self.whole = 0, [], ""     # `whole` is the text of `count` ids; `last` the last BACK

    def _whole(self, token_ids: list[int]) -> str:
        """The text of all of `token_ids`, as `decode` gives it."""
        n, m = self.count, len(token_ids)
        start = max(0, n - BACK)
        if n and m >= n and token_ids[start:n] == self.last[len(self.last) - (n - start):]:
            old = self.decode(token_ids[start:n])
            if start == 0 or (old and self.whole.endswith(old)):
                self.whole = self.whole[:len(self.whole) - len(old)] + self.decode(token_ids[start:])
            else:
                self.whole = self.decode(token_ids)
        else:
            self.whole = self.decode(token_ids)
        self.count, self.last = m, token_ids[max(0, m - BACK):]
        return self.whole

    def text(self, token_ids: list[int]) -> str:
        """All of `token_ids` as text, cut before the first stop string ("" without a tokenizer: decode None)."""
        text = self._whole(token_ids) if self.decode is not None else ""
        for s in self.stops:
            if s in text:
                text = text[: text.index(s)]
        return text

    def delta(self, token_ids: list[int], final: bool) -> str:
        text = self.text(token_ids)
        if not final and self.hold:
            text = text[: max(len(self.sent), len(text) - self.hold)]
        if text.endswith("\ufffd") and not final:  # half a multi-byte character: wait for the rest
            text = text[:-1]
        delta, self.sent = text[len(self.sent):], max(text, self.sent, key=len)
        return delta
