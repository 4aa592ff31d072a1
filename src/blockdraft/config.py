"""Frozen, validated configs: one per concern, built once by `checkpoints.resolve`.

Nothing here knows a foreign spelling: each target family's file (`models/families/`) maps its
published config onto `TargetConfig`, `checkpoints/resolve.py` maps drafter layouts onto
`DrafterConfig`. Every `ValueError` names the field and value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")
TARGET_LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention", "short_conv")
STATE_LAYER_TYPES = ("sliding_attention", "linear_attention", "short_conv")
LAYER_TYPES = ("full_attention", "sliding_attention")


def _positive(name: str, value: int | float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 2048
    low_freq_factor: float = 1.0     # llama3
    high_freq_factor: float = 4.0    # llama3
    beta_fast: float = 32.0          # yarn
    beta_slow: float = 1.0           # yarn
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    # proportional (Gemma 4's full layers): the first `partial_rotary_factor` of each half of the head
    # rotates, at frequencies theta^(-2i/head_dim); the rest pass through
    partial_rotary_factor: float = 1.0

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ConfigError(f"rope_type {self.rope_type!r} is not supported (supported: {ROPE_TYPES})")
        _positive("rope_theta", self.theta)
        _positive("rope factor", self.factor)


@dataclass(frozen=True)
class DecoderDims:
    """Shapes every decoder stack has (targets and drafters alike)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def _check_dims(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            _positive(name, getattr(self, name))


@dataclass(frozen=True)
class DeltaNetConfig:
    """Gated DeltaNet ("linear_attention") layers of a Qwen3.5 target: a causal depthwise conv over
    q/k/v (state: its last `conv_kernel - 1` input rows) and a recurrent state [v_heads, k_dim, v_dim]."""

    num_k_heads: int
    num_v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int

    def __post_init__(self):
        for name in ("num_k_heads", "num_v_heads", "k_dim", "v_dim", "conv_kernel"):
            _positive(f"linear {name}", getattr(self, name))
        if self.num_v_heads % self.num_k_heads:
            raise ConfigError(f"linear_num_value_heads={self.num_v_heads} is not divisible by "
                              f"linear_num_key_heads={self.num_k_heads}")

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.k_dim + self.num_v_heads * self.v_dim


@dataclass(frozen=True)
class ShortConvConfig:
    """LFM2 short-convolution layers: y = C ⊙ conv(B ⊙ x), a depthwise causal conv of `conv_kernel`
    taps over the hidden width (state: its last `conv_kernel - 1` input rows; no recurrence)."""

    conv_dim: int
    conv_kernel: int
    bias: bool = False

    def __post_init__(self):
        _positive("conv_dim", self.conv_dim)
        _positive("conv_L_cache", self.conv_kernel)


MOE_ROUTERS = ("softmax", "sigmoid", "topk_softmax", "normed_softmax")
MOE_ACTIVATIONS = ("silu", "clamped_swiglu", "gelu_tanh")
HIDDEN_ACTS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class MoeConfig:
    """A sparse MoE feed-forward. Routers: "softmax" (Qwen3.5-MoE: softmax over all experts, top-k,
    renormalised), "sigmoid" (LFM2-MoE: sigmoid scores, top-k chosen on score + a per-expert bias,
    the chosen scores renormalised), "topk_softmax" (gpt-oss: top-k of the logits, softmax over
    those k) or "normed_softmax" (Gemma 4, `models/gemma4.py`: softmax over a normed and scaled copy of
    the stream, top-k renormalised, per-expert scales). The top-k weights are then scaled by
    `routed_scaling`. `biases`: the router and the experts' projections carry biases (gpt-oss).
    Activations: SwiGLU ("silu"), GeGLU ("gelu_tanh", Gemma 4) or gpt-oss's clamped one,
    (clamp(up, ±L) + 1) · g · sigmoid(1.702 g) with g = min(gate, L), L = `swiglu_limit`.
    A shared expert (sigmoid-gated, Qwen3.5) where `shared_intermediate_size` > 0; the first
    `dense_layers` layers run a dense MLP instead (LFM2-MoE's `num_dense_layers`)."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0
    router: str = "softmax"
    norm_topk: bool = True
    routed_scaling: float = 1.0
    expert_bias: bool = False
    dense_layers: int = 0
    biases: bool = False
    activation: str = "silu"
    swiglu_limit: float = 7.0

    def __post_init__(self):
        for name in ("num_experts", "top_k", "expert_intermediate_size", "routed_scaling"):
            _positive(name, getattr(self, name))
        if self.top_k > self.num_experts:
            raise ConfigError(f"num_experts_per_tok={self.top_k} exceeds num_experts={self.num_experts}")
        if self.router not in MOE_ROUTERS:
            raise ConfigError(f"MoE router {self.router!r} is not supported (supported: {MOE_ROUTERS})")
        if self.activation not in MOE_ACTIVATIONS:
            raise ConfigError(f"MoE activation {self.activation!r} is not supported (supported: {MOE_ACTIVATIONS})")
        _positive("swiglu_limit", self.swiglu_limit)
        for name in ("shared_intermediate_size", "dense_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class TargetConfig(DecoderDims):
    """A decoder-only target: Llama, Qwen3, Qwen3.5 (hybrid Gated DeltaNet + gated attention, dense or
    MoE), LFM2 (short conv + attention, dense or MoE), gpt-oss (sliding-window and full attention with
    sinks, MoE) or Gemma 4 (sliding-window and full attention, shared KV, per-layer embeddings, dense or MoE)."""

    architecture: str
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Qwen3.5: per-layer kind, DeltaNet shapes, MoE, and the attention details that differ from Qwen3
    layer_types: tuple[str, ...] = ()            # empty: every layer full attention
    deltanet: DeltaNetConfig | None = None
    short_conv: ShortConvConfig | None = None    # LFM2
    moe: MoeConfig | None = None
    partial_rotary_factor: float = 1.0           # rotary on the first head_dim * factor dims
    attn_output_gate: bool = False               # q_proj emits query and gate; output x sigmoid(gate)
    norm_offset: bool = False                    # RMSNorm gains are (1 + w)
    # gpt-oss: sliding-window layers see 0 <= q - k < sliding_window; a learned per-head logit joins
    # every softmax denominator (`sinks`)
    sliding_window: int | None = None
    attention_sinks: bool = False
    # Gemma 4: full-attention layers' own geometry and RoPE, V = the raw K projection on full layers
    # (`attention_k_eq_v`), the last `kv_shared_layers` layers reusing the K/V of the last earlier layer of
    # their type, per-layer embeddings (`per_layer_input_size` > 0), a gelu-tanh MLP twice as wide on the
    # shared layers (`double_wide_mlp`), final-logit softcapping
    global_head_dim: int | None = None
    global_kv_heads: int | None = None
    global_rope: RopeConfig | None = None
    attention_k_eq_v: bool = False
    kv_shared_layers: int = 0
    per_layer_input_size: int = 0
    per_layer_vocab_size: int = 0
    double_wide_mlp: bool = False
    hidden_act: str = "silu"
    final_logit_softcapping: float | None = None

    def __post_init__(self):
        from .models.registry import architectures     # the families import this module
        if self.architecture not in architectures():
            raise ConfigError(f"architecture {self.architecture!r} is not supported (supported: {architectures()})")
        self._check_dims()
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise ConfigError(f"layer_types has {len(self.layer_types)} entries for "
                                  f"num_hidden_layers={self.num_layers}")
            unknown = sorted({t for t in self.layer_types if t not in TARGET_LAYER_TYPES})
            if unknown:
                raise ConfigError(f"layer_types entries {unknown} are not supported (supported: "
                                  f"{TARGET_LAYER_TYPES})")
            if "linear_attention" in self.layer_types and self.deltanet is None:
                raise ConfigError("layer_types has linear_attention layers but no linear_* (DeltaNet) shapes")
            if "short_conv" in self.layer_types and self.short_conv is None:
                raise ConfigError("layer_types has short-conv layers but no conv_L_cache")
            if "sliding_attention" in self.layer_types:
                if self.sliding_window is None:
                    raise ConfigError("layer_types has sliding_attention layers but sliding_window is not set")
                if not isinstance(self.sliding_window, int) or self.sliding_window < 2:
                    raise ConfigError(f"sliding_window must be an integer >= 2, got {self.sliding_window!r}")
        if not 0 < self.partial_rotary_factor <= 1 or int(self.head_dim * self.partial_rotary_factor) % 2:
            raise ConfigError(f"partial_rotary_factor={self.partial_rotary_factor} with head_dim={self.head_dim} "
                              "must give an even rotary width in (0, head_dim]")
        _positive("max_position_embeddings", self.max_position_embeddings)
        if self.hidden_act not in HIDDEN_ACTS:
            raise ConfigError(f"hidden_act={self.hidden_act!r} is not supported (supported: {HIDDEN_ACTS})")
        if not 0 <= self.kv_shared_layers < self.num_layers:
            raise ConfigError(f"num_kv_shared_layers={self.kv_shared_layers} must be in [0, num_hidden_layers="
                              f"{self.num_layers})")
        for i in range(self.num_layers - self.kv_shared_layers, self.num_layers):
            if self.kv_source(i) is None:
                raise ConfigError(f"layer {i} shares K/V (num_kv_shared_layers={self.kv_shared_layers}) but no "
                                  f"earlier layer is {self.layer_type(i)}")
        for name in ("global_head_dim", "global_kv_heads"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.final_logit_softcapping is not None:
            _positive("final_logit_softcapping", self.final_logit_softcapping)
        if self.moe is not None and self.moe.dense_layers > self.num_layers:
            raise ConfigError(f"num_dense_layers={self.moe.dense_layers} exceeds num_hidden_layers={self.num_layers}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_attention_heads={self.num_heads} is not divisible by "
                              f"num_key_value_heads={self.num_kv_heads}")
        if self.global_kv_heads is not None and self.num_heads % self.global_kv_heads:
            raise ConfigError(f"num_attention_heads={self.num_heads} is not divisible by the full-attention "
                              f"layers' key/value heads ({self.global_kv_heads})")

    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else "full_attention"

    def kv_shared(self, layer: int) -> bool:
        """Whether the layer reuses an earlier layer's K/V (Gemma 4's last `num_kv_shared_layers`)."""
        return layer >= self.num_layers - self.kv_shared_layers

    def kv_source(self, layer: int) -> int | None:
        """The layer whose K/V this one attends with: itself, or for a shared layer the last non-shared
        layer of its type (None: there is none)."""
        if not self.kv_shared(layer):
            return layer
        first = self.num_layers - self.kv_shared_layers
        same = [j for j in range(first) if self.layer_type(j) == self.layer_type(layer)]
        return same[-1] if same else None

    def kv_geometry(self, layer: int) -> tuple[int, int]:
        """(kv heads, head dim) of an attention layer: full layers may have their own (Gemma 4)."""
        if self.layer_type(layer) == "full_attention":
            return self.global_kv_heads or self.num_kv_heads, self.global_head_dim or self.head_dim
        return self.num_kv_heads, self.head_dim

    @property
    def paged_kv_geometry(self) -> tuple[int, int]:
        """(kv heads, head dim) of the paged layers (full attention), or the model's own."""
        layers = self.attention_layers
        return self.kv_geometry(layers[0]) if layers else (self.num_kv_heads, self.head_dim)

    @property
    def attention_layers(self) -> list[int]:
        """Layers with a paged KV cache (full attention that does not reuse another layer's; sliding-window
        layers keep their window as state)."""
        return [i for i in range(self.num_layers) if self.layer_type(i) == "full_attention" and not self.kv_shared(i)]

    @property
    def state_layers(self) -> list[int]:
        """Layers with a per-sequence state (Gated DeltaNet, short conv, a sliding window's K/V), which
        cannot roll back by length."""
        return [i for i in range(self.num_layers)
                if self.layer_type(i) in STATE_LAYER_TYPES and not self.kv_shared(i)]

    @property
    def state_layout(self):
        """What one sequence's state holds (`cache/state.py`): per state layer a window of rows — a
        DeltaNet's or short conv's last K-1 conv inputs, a sliding layer's last W-1 keys ‖ values — and
        the DeltaNet layers' recurrent state."""
        from .cache.state import StateLayout
        windows = {}
        for i in self.state_layers:
            kind = self.layer_type(i)
            if kind == "linear_attention":
                windows[i] = (self.deltanet.conv_kernel - 1, self.deltanet.conv_dim)
            elif kind == "short_conv":
                windows[i] = (self.short_conv.conv_kernel - 1, self.short_conv.conv_dim)
            else:
                heads, dim = self.kv_geometry(i)
                windows[i] = (self.sliding_window - 1, 2 * heads * dim)
        recurrent = tuple(i for i in self.state_layers if self.layer_type(i) == "linear_attention")
        return StateLayout(windows, self.deltanet if recurrent else None, recurrent)

    def sparse_layer(self, layer: int) -> bool:
        """Whether the layer's feed-forward is the MoE block (else a dense MLP)."""
        return self.moe is not None and layer >= self.moe.dense_layers

    @property
    def hybrid(self) -> bool:
        return bool(self.state_layers)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)


TAP_POINTS = ("hidden_states", "layer_output")


@dataclass(frozen=True)
class Taps:
    """What the target hands a drafter: these layers, read at this point, packed in this order."""

    layers: tuple[int, ...]
    point: str = "hidden_states"


@dataclass(frozen=True)
class DrafterConfig(DecoderDims):
    """One block drafter, whatever spelling it was published in (docs/design.md §2-3)."""

    kind: str
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    block_size: int
    shift_label: bool
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    attention_bias: bool = False
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    use_sliding_window: bool = True  # HF Qwen3 semantics: False disables the window (layers stay causal)
    is_causal: bool | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # the kind's own head settings, a frozen record its module defines (`DrafterKind.heads`: DSpark's
    # Markov and confidence heads, DFlash2's convs and selector); None for a kind without any
    heads: Any = None
    # weights the drafter ships itself (else the target's are reused)
    own_embed_tokens: bool = False
    own_lm_head: bool = False
    num_draft_tokens: int = 0  # 0 = derived from shift_label
    # which value of a tapped layer the drafter reads (docs/design.md §2 "Tap point"): "hidden_states"
    # (HF output_hidden_states: the last layer after the final norm) or "layer_output" (every
    # layer's raw output, the last one before the final norm)
    tap_point: str = "hidden_states"
    # reduced draft vocabulary (speculators / EAGLE-3 spelling): the drafter's own LM head and the
    # Markov head's output cover `draft_vocab_size` tokens, mapped to target ids by `d2t`; 0 = the
    # whole vocabulary
    draft_vocab_size: int = 0
    # RoPE trained on interleaved (GPT-J) pairs; run as NeoX on reordered q/k weights
    # (`checkpoints/rope_layout.py`)
    rope_interleaved: bool = False
    # DeepSpec's Gemma 4 DSpark: Gemma-style blocks (sandwich norms, GeGLU MLP, layer scalars, a gain-less
    # V norm, attention scale 1.0, V = K where `attention_k_eq_v`) and its own embedding scaled by √H
    gemma_blocks: bool = False
    attention_k_eq_v: bool = False

    @property
    def taps(self) -> "Taps":
        return Taps(self.target_layer_ids, self.tap_point)

    @property
    def pruned_vocab(self) -> bool:
        return 0 < self.draft_vocab_size

    @property
    def output_vocab_size(self) -> int:
        """Width of the drafter's logits: the draft vocabulary, or the whole one."""
        return self.draft_vocab_size or self.vocab_size

    def __post_init__(self):
        derived = self.block_size if self.shift_label else self.block_size - 1
        if self.num_draft_tokens == 0:
            object.__setattr__(self, "num_draft_tokens", derived)
        from .drafters.registry import drafter_kind, kind_of_heads     # the kinds import this module
        kind = drafter_kind(self.kind)                    # named ConfigError for an unknown kind
        self._check_dims()
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        if not self.target_layer_ids:
            raise ConfigError("target_layer_ids is empty: the drafter needs at least one tap")
        if self.tap_point not in TAP_POINTS:
            raise ConfigError(f"tap_point {self.tap_point!r} is not supported (choose from {', '.join(TAP_POINTS)})")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id={self.mask_token_id} is outside the vocabulary "
                              f"[0, {self.vocab_size})")
        if len(self.layer_types) != self.num_layers:
            raise ConfigError(f"layer_types has {len(self.layer_types)} entries for "
                              f"num_hidden_layers={self.num_layers}")
        for t in self.layer_types:
            if t not in LAYER_TYPES:
                raise ConfigError(f"layer_types entry {t!r} is not supported (supported: {LAYER_TYPES})")
        if "sliding_attention" in self.layer_types and self.use_sliding_window:
            if self.sliding_window is None:
                raise ConfigError("layer_types has sliding_attention layers but sliding_window is not set")
            _positive("sliding_window", self.sliding_window)
        if self.final_logit_softcapping is not None and self.final_logit_softcapping < 0:
            raise ConfigError(f"final_logit_softcapping must be >= 0, got {self.final_logit_softcapping}")
        if not self.shift_label and self.num_draft_tokens == self.block_size:
            raise ConfigError(f"shift_label=False with num_draft_tokens == block_size == {self.block_size} "
                              "would read past the block (the anchor slot does not predict)")
        if self.num_draft_tokens != derived:
            raise ConfigError(f"num_draft_tokens={self.num_draft_tokens} does not fit block_size="
                              f"{self.block_size} with shift_label={self.shift_label} (expected {derived})")
        if self.draft_vocab_size:
            if not 0 < self.draft_vocab_size <= self.vocab_size:
                raise ConfigError(f"draft_vocab_size={self.draft_vocab_size} must be in [1, vocab_size="
                                  f"{self.vocab_size}]")
            if not self.own_lm_head:
                raise ConfigError(f"draft_vocab_size={self.draft_vocab_size} needs the drafter's own "
                                  "lm_head.weight [draft_vocab_size, hidden_size]; it has none")
        owner = kind_of_heads(self.heads)
        if self.heads is not None and owner is None:
            raise ConfigError(f"heads={self.heads!r} are no drafter kind's head settings")
        if owner is not None and owner is not kind:
            raise ConfigError(f"this drafter declares {owner.title} heads ({', '.join(self.heads.set_fields())}) "
                              f"but runs as {self.kind!r}; run it in {owner.name!r} mode")
        kind.check(self)

    def layer_is_causal(self, layer: int) -> bool:
        if self.is_causal is not None:
            return self.is_causal
        return self.layer_types[layer] == "sliding_attention"

    def layer_window(self, layer: int) -> int | None:
        if self.layer_types[layer] != "sliding_attention" or not self.use_sliding_window:
            return None
        return self.sliding_window
