"""vLLM-style offline API: `LLM(target=..., drafter=...).generate(prompts, sampling_params)`.

Owns the loaded models and the tokenizer; turns text into ids and ids back into
text (cutting stop strings). Prompts run through the batch engine (`max_batch`
at a time, paged cache sized for them unless `cache_budget_bytes` is given).
A request may reach `max_model_len`, else the target's max_position_embeddings
(`max_model_len_source` says which).
With `adaptive_speculation` (the default) greedy requests verify the number of drafts that
measures fastest on this machine and batch size (`engine/policy.py`; 0 = a plain step), so
acceptance lengths then include plain steps (AL 1); output is the same either way. Off, every
step drafts the full width (capped by `num_speculative_tokens`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from .default_model import DEFAULT_DRAFTER, DEFAULT_DRAFTERS, NAME
from .drafters import registry as drafter_kinds
from .engine.engine import EngineConfig, LLMEngine, RequestOutput
from .engine.spec import ModelSpec
from .errors import ConfigError, RequestError
from .loading import check_shareable, load_models, with_drafter
from .numerics import describe, resolve_device, resolve_dtype, resolve_quantization
from .sampling.params import SamplingParams
from .tokenizer import TextStream, Tokenizer

log = logging.getLogger(__name__)

BUDGET_ROW_TOKENS = 4096       # tokens per batch row the default cache budget holds under a longer model limit
TINY_ASSETS = Path(__file__).parent / "assets" / "tiny"            # test fixtures (random tiny Qwen3 + drafters)


def is_default_target(target: str | Path | None) -> bool:
    return target is None or str(target) == NAME


def target_dir_of(target: str | Path | None) -> Path:
    """The default model's directory (converted from its GGUF on first use), or `target` itself."""
    if is_default_target(target):
        from .default_model import smollm2_dir

        return smollm2_dir()
    return Path(target)


def resolve_drafter_dir(target: str | Path | None, drafter: str | Path | None) -> Path | None:
    """`none` → no drafter; a shipped name (dflash, dspark) → the default target's drafter; else a dir."""
    if drafter is None or str(drafter) == "none":
        return None
    if str(drafter) in DEFAULT_DRAFTERS:
        if not is_default_target(target):
            raise ConfigError(f"--drafter {drafter} names a drafter shipped for the default target ({NAME}); "
                              f"with --target {target} pass a drafter directory")
        return DEFAULT_DRAFTERS[str(drafter)]
    if str(drafter) in drafter_kinds.NAMES:
        raise ConfigError(f"no {drafter_kinds.drafter_kind(str(drafter)).title} drafter is shipped for the default "
                          "target; pass a drafter directory")
    return Path(drafter)


def target_dtype(target: str | Path | None, target_dir: Path, requested: str | None, device: str) -> str:
    """The dtype `target` loads in: `requested`, else `numerics.resolve_dtype`'s choice for its stored weights."""
    stored = None
    if requested in (None, "auto") and not is_default_target(target):
        from .checkpoints.weights import stored_dtype

        stored = stored_dtype(target_dir)
    return resolve_dtype(requested, device, default_model=is_default_target(target), stored=stored)


def width_policy_file(target_dir: Path, drafter_dir: Path, numerics: str, device, confidence_threshold: float
                      ) -> Path:
    """Where the width policy's measurements for these models on this machine persist."""
    import hashlib
    import json

    import torch

    from .default_model import cache_root
    from .numerics import cpu_model

    identity = json.dumps([str(Path(target_dir).resolve()), str(Path(drafter_dir).resolve()), numerics, str(device),
                           confidence_threshold, torch.get_num_threads(), cpu_model(), torch.__version__])
    return cache_root() / "width-policy" / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.json"


class LLM:
    def __init__(self, target: str | Path | None = None, drafter: str | Path | None = "default",
                 mode: str | None = None, dtype: str | None = None, max_batch: int = 8,
                 block_size: int | None = None, confidence_threshold: float = 0.0,
                 cache_budget_bytes: int | None = None, max_model_len: int | None = None,
                 prefix_caching: bool = True, adaptive_speculation: bool = True,
                 num_speculative_tokens: int | None = None, tp=None, quantization: str | None = None,
                 device: str | None = None, remember_width_costs: bool = False, share_target: LLM | None = None):
        """`tp`: this process's TPGroup when it is one rank of a tensor-parallel group; the models
        are sharded and, on rank 0, `engine` mirrors every command to the other ranks.
        `remember_width_costs`: the width policy's measurements persist in the cache directory, per
        models, numerics, device, threads and CPU (`width_policy_file`); `generate` and `serve` set it.
        `share_target`: an LLM of the same target, numerics and device whose loaded target (the same
        tensors, not a copy) this one runs, with its own drafter and engine: drafters compared side by side
        over one copy of the weights (two copies of the same weights can decode several percent apart,
        by where in memory each landed)."""
        if drafter == "default":
            drafter = DEFAULT_DRAFTER if is_default_target(target) else None
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        if not 0.0 <= confidence_threshold < 1.0:
            raise ConfigError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        drafter_dir = resolve_drafter_dir(target, drafter)
        device = resolve_device(device)
        target_dir = target_dir_of(target)
        dtype = target_dtype(target, target_dir, dtype, device)
        tensor_parallel = tp is not None and tp.world > 1
        quantization = resolve_quantization(quantization, device, default_model=is_default_target(target),
                                            tensor_parallel=tensor_parallel, dtype=dtype)
        if quantization != "none" and tensor_parallel:
            raise ConfigError(f"quantization={quantization} with tensor parallelism is not supported "
                              "(the weight-only layers are not sharded); use quantization=none")
        started = time.perf_counter()
        if share_target is not None:
            check_shareable(share_target.models, target_dir, dtype, quantization, device, tensor_parallel)
        else:
            log.info("loading target %s (%s%s, %s)", target_dir, dtype,
                     "" if quantization == "none" else f", {quantization} weights", device)
        if drafter_dir is not None:
            log.info("loading drafter %s", drafter_dir)
        self.models = (with_drafter(share_target.models, drafter_dir, mode, block_size) if share_target is not None
                       else load_models(target_dir, drafter_dir, dtype, quantization, device, mode, block_size))
        self.target, self.drafter = self.models.target, self.models.drafter
        self.numerics = describe(self.target.dtype, self.models.quantization, self.models.kernel, device)
        self.tokenizer = Tokenizer(target_dir) if (target_dir / "tokenizer.json").is_file() else None
        self.max_batch = max_batch
        self.confidence_threshold = confidence_threshold
        if tp is not None and tp.world > 1:
            from .parallel.shard import shard_models

            shard_models(self.target, [self.drafter] if self.drafter is not None else [], tp)
            adaptive_speculation = False          # timing-based decisions would differ between ranks
        if max_model_len is not None:
            self.max_model_len, self.max_model_len_source = max_model_len, "max_model_len"
        else:
            self.max_model_len = self.target.config.max_position_embeddings
            self.max_model_len_source = "the target's max_position_embeddings"
        log.info("context limit: %d tokens (%s)", self.max_model_len, self.max_model_len_source)
        budget = cache_budget_bytes or self._default_budget(self.max_model_len, max_batch, max_model_len is not None)
        remember = remember_width_costs and adaptive_speculation and self.drafter is not None
        self.engine = LLMEngine(self.target, self.drafter, EngineConfig(
            max_batch=max_batch, cache_budget_bytes=budget, max_model_len=self.max_model_len,
            prefix_caching=prefix_caching, confidence_threshold=confidence_threshold,
            adaptive_speculation=adaptive_speculation, num_speculative_tokens=num_speculative_tokens,
            policy_file=str(width_policy_file(target_dir, drafter_dir, self.numerics, device,
                                              confidence_threshold)) if remember else None),
            self._eos_ids(),
            self.tokenizer.decode if self.tokenizer is not None else None)
        plan = self.engine.plan
        log.info("cache: %d pages of %d tokens (%.0f MiB)", plan.num_blocks, plan.page_size, plan.total_bytes / 2**20)
        if tp is not None and tp.world > 1 and tp.rank == 0:
            from .parallel.mirror import MirroredEngine

            self.engine = MirroredEngine(self.engine, tp)
        log.info("ready in %.1f s", time.perf_counter() - started)

    def _default_budget(self, max_len: int, max_batch: int, users_limit: bool) -> int:
        """KV bytes for `max_batch` sequences of `max_len` tokens when the user set that limit; under the
        model's own (often 32k+) limit, `max_batch` rows of at most BUDGET_ROW_TOKENS and room for one
        full-length sequence, so memory stays sane and any admitted request still fits alone."""
        spec = ModelSpec.of(self.target, self.drafter)
        if users_limit or max_len <= BUDGET_ROW_TOKENS:
            return spec.cache_budget(max_len, max_batch)
        return max(spec.cache_budget(BUDGET_ROW_TOKENS, max_batch), spec.cache_budget(max_len, 1))

    def _eos_ids(self) -> frozenset[int]:
        ids = set(self.target.config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    def _need_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise RequestError(f"{self.models.target_dir} has no tokenizer.json; pass prompt_token_ids")
        return self.tokenizer

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        return self._need_tokenizer().encode_prompt(prompt, chat)

    def generate(self, prompts: str | list[str] | None = None, sampling_params: SamplingParams | None = None,
                 prompt_token_ids: list[list[int]] | None = None, chat: bool = False) -> list[RequestOutput]:
        params = sampling_params or SamplingParams()
        if (prompts is None) == (prompt_token_ids is None):
            raise RequestError("pass exactly one of prompts or prompt_token_ids")
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            prompt_token_ids = [self.encode(p, chat) for p in prompts]
        for i, ids in enumerate(prompt_token_ids):
            if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) for t in ids):
                raise RequestError(f"prompt_token_ids[{i}] must be a list of ints")
        outs = self.engine.generate([list(ids) for ids in prompt_token_ids], params)
        decode = self.tokenizer.decode if self.tokenizer is not None else None
        return [replace(o, text=TextStream(decode, params.stop).text(o.token_ids)) for o in outs]
