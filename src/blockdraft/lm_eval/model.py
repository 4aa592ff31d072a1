"""`BlockdraftLM`: lm-eval's model interface over a blockdraft `LLM`.

- `generate_until`: every request through the batch engine with the drafter (speculative; greedy
  output equals the target's own), stop strings (`until`) cut where they start, `max_gen_toks`,
  sampling when the task asks for it (seeded per request). Contexts longer than the model's
  limit keep their last tokens, as lm-eval's HF model does.
- `loglikelihood`, `loglikelihood_rolling`: the target alone, one full forward per request window
  (`target.logits`), log-softmax in fp32.
- Chat templates: `apply_chat_template` renders the target tokenizer's own template.
- Acceptance statistics of every generation so far go into lm-eval's results (`config.blockdraft`)
  through `get_model_info`.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from ..default_model import DEFAULT_DRAFTER
from ..errors import ConfigError
from ..evaluation.stats import mean_al_ci
from ..sampling.params import SamplingParams
from ..tokenizer import TextStream

log = logging.getLogger(__name__)


def _device(requested: str | None) -> str:
    """lm-eval's command line sends `cuda:0` unless told otherwise; without CUDA that means the CPU,
    as for lm-eval's own HF model (a warning says so)."""
    if requested is None:
        return "cpu"
    if str(requested).startswith("cuda") and not torch.cuda.is_available():
        log.warning("device %s requested but no CUDA device is visible: running on the CPU (--device cpu "
                    "silences this)", requested)
        return "cpu"
    return str(requested)


class BlockdraftLM(TemplateLM):
    def __init__(self, target: str | None = None, drafter: str = DEFAULT_DRAFTER, mode: str | None = None,
                 dtype: str = "auto", quantization: str = "auto", device: str | None = None,
                 max_batch: int | None = None,
                 max_length: int | None = None, max_gen_toks: int = 256, add_bos_token: bool = False,
                 adaptive_speculation: bool = False, seed: int = 0, threads: int | None = None,
                 batch_size=None, max_batch_size=None, **unknown):
        """Arguments are `--model_args` keys. `max_batch`: requests decoded together (default: lm-eval's
        `--batch_size` when it is a number, else 8); `max_length` caps prompt + generation (default: the
        target's limit)."""
        super().__init__()
        if unknown:
            raise ConfigError(f"--model_args: unknown key(s) {sorted(unknown)} for model blockdraft; known: target, "
                              "drafter, mode, dtype, quantization, device, max_batch, max_length, max_gen_toks, "
                              "add_bos_token, adaptive_speculation, seed, threads")
        from ..llm import LLM

        if threads is not None:
            torch.set_num_threads(int(threads))
        if max_batch is None:
            max_batch = int(batch_size) if str(batch_size).isdigit() else 8
        for name, value in (("max_batch", max_batch), ("max_gen_toks", max_gen_toks)):
            if int(value) < 1:
                raise ConfigError(f"--model_args {name} must be >= 1, got {value}")
        self.llm = LLM(target=target, drafter=None if str(drafter) == "none" else drafter, mode=mode, dtype=dtype,
                       quantization=quantization, device=_device(device), max_batch=int(max_batch),
                       max_model_len=int(max_length) if max_length else None,
                       adaptive_speculation=bool(adaptive_speculation))
        self._bind(self.llm, self.llm.engine, str(drafter), int(max_gen_toks), bool(add_bos_token), int(seed))

    @classmethod
    def around(cls, llm, engine, drafter_name: str, max_gen_toks: int = 256, seed: int = 0) -> "BlockdraftLM":
        """A model over an already loaded `LLM` whose requests run on `engine` (with or without a drafter):
        how `blockdraft eval` runs an lm-eval task twice on one loaded target."""
        self = cls.__new__(cls)
        TemplateLM.__init__(self)
        self._bind(llm, engine, drafter_name, max_gen_toks, False, seed)
        return self

    def _bind(self, llm, engine, drafter_name: str, max_gen_toks: int, add_bos_token: bool, seed: int) -> None:
        if llm.tokenizer is None:
            raise ConfigError(f"--model_args target: {llm.models.target_dir} has no tokenizer.json")
        self.llm, self.engine, self.tok = llm, engine, llm.tokenizer
        self.max_length = engine.max_model_len
        self.max_gen_toks, self.add_bos_token, self.seed = max_gen_toks, add_bos_token, seed
        self.acceptance_lengths: list[list[int]] = []          # per generated request
        self.generated_tokens, self.generate_seconds = 0, 0.0
        self._drafter_name = drafter_name

    # ---- tokenization ---------------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.tok.eos_token_id
        return eos if eos is not None else min(self.llm.target.config.eos_token_ids)

    @property
    def tokenizer_name(self) -> str:
        return str(self.llm.models.target_dir).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tok.encode(string, add_special_tokens=self.add_bos_token if add_special_tokens is None
                               else add_special_tokens)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tok.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tok.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)

    # ---- scoring: the target alone --------------------------------------------------------------------
    @torch.inference_mode()
    def _continuation_logprob(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """log P(continuation | context) from one forward over context + continuation (left-truncated to
        max_length + 1 tokens), and whether greedy decoding would have produced the continuation."""
        whole = (context + continuation)[-(self.max_length + 1):]
        logits = self.llm.target.logits(whole[:-1])[0, -len(continuation):].float()   # [n_cont, vocab]
        logprobs = F.log_softmax(logits, dim=-1)
        target = torch.tensor(continuation, device=logprobs.device)
        greedy = bool((logits.argmax(dim=-1) == target).all())
        return float(logprobs.gather(1, target[:, None]).sum()), greedy

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        out = []
        for key, context, continuation in requests:
            if not continuation:
                raise ConfigError(f"loglikelihood request {key!r}: the continuation encodes to no tokens")
            result = self._continuation_logprob(context, continuation)
            self.cache_hook.add_partial("loglikelihood", key, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in requests:
            (text,) = req.args
            windows = map(make_disjoint_window, get_rolling_token_windows(
                self.tok_encode(text, add_special_tokens=False), self.prefix_token_id, self.max_length, 1))
            total = sum(self._continuation_logprob(ctx, cont)[0] for ctx, cont in windows)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    # ---- generation: the batch engine with the drafter ----------------------------------------------
    def _params(self, gen_kwargs: dict, index: int) -> SamplingParams:
        kwargs = dict(gen_kwargs)
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_tokens = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
        do_sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
        top_p, top_k = float(kwargs.pop("top_p", 1.0) or 1.0), int(kwargs.pop("top_k", 0) or 0)
        if kwargs:
            raise ConfigError(f"generation_kwargs: unsupported key(s) {sorted(kwargs)} (blockdraft takes until, "
                              "max_gen_toks, do_sample, temperature, top_p, top_k)")
        if not do_sample:
            temperature, top_p, top_k = 0.0, 1.0, 0
        return SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                              seed=self.seed + index if temperature > 0 else None, stop=[u for u in until if u] or None)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        prompts, params = [], []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args
            p = self._params(gen_kwargs, i)
            ids = self.tok_encode(context)[-(self.max_length - p.max_tokens):]
            prompts.append(ids)
            params.append(p)
        started = time.perf_counter()
        outs = self.engine.generate(prompts, params) if prompts else []
        self.generate_seconds += time.perf_counter() - started
        texts = []
        for req, out, p in zip(requests, outs, params):
            text = TextStream(self.tok.decode, p.stop).text(out.token_ids)
            self.acceptance_lengths.append(list(out.acceptance_lengths))
            self.generated_tokens += len(out.token_ids)
            self.cache_hook.add_partial("generate_until", req.args, text)
            texts.append(text)
        return texts

    # ---- what lm-eval records -------------------------------------------------------------------------
    def acceptance(self) -> dict:
        """Acceptance statistics over every request generated so far."""
        al = mean_al_ci(self.acceptance_lengths)
        steps = [a for lengths in self.acceptance_lengths for a in lengths]
        drafter = self.engine.spec.drafter
        block = drafter.num_draft_tokens + 1 if drafter is not None else 1
        return {"drafter": None if drafter is None else self._drafter_name,
                "drafter_kind": None if drafter is None else drafter.kind,
                "requests": len(self.acceptance_lengths), "generated_tokens": self.generated_tokens,
                "tokens_per_s": self.generated_tokens / self.generate_seconds if self.generate_seconds else None,
                "mean_al": al["mean_al"], "al_ci95": al["ci95"], "verify_steps": al["steps"],
                "per_position_acceptance": [sum(a > k for a in steps) / len(steps) for k in range(1, block)]
                if steps else []}

    def get_model_info(self) -> dict:
        return {"blockdraft": {**self.acceptance(), "numerics": self.llm.numerics,
                               "target": str(self.llm.models.target_dir)}}
