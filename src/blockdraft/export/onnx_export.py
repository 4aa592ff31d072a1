"""`blockdraft export onnx`: an ONNX Runtime GenAI 0.18 model directory that og.Engine runs on CPU.

Layout of OUT_DIR (ORT-GenAI's own names, `docs/ortgenai_contract.md`):
  model.onnx (+ model.onnx.data)       the target: packed ids, paged K/V, logits + `aux_hidden_states`
  dspark.onnx | dflash2.onnx (+ .data) the drafter: packed context + blocks, paged K/V -> the lattice
  shared_weights.bin                   tensors both graphs use (the target's embedding and LM head),
                                       stored once and referenced by both as external initializers
  genai_config.json                    only keys the 0.18 parser accepts: `model.decoder` +
                                       `model.dspark` | `model.dflash2`, `engine.dynamic_batching`
                                       (its `block_size` is the KV page), `speculative.max_draft_tokens`
  tokenizer.json, tokenizer_config.json (copied from the target)

Attention is plain ONNX (Gather by block table, ScatterND of the new rows; `export/paged.py`), so
the CPU execution provider runs it. blockdraft's own onnxruntime backend reads the same directory.
A sliding-window ring (`sliding_window > 0`) is declared only when every drafter layer slides with
one window; DFlash2 needs one (0.18 refuses `sliding_window <= 0` there), so a DFlash2 drafter
with a full-attention layer is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from ..errors import ConfigError
from ..loading import load_drafter, load_target
from ..drafters import registry as kinds
from ..drafters.registry import drafter_kind
from ..models.registry import family_of
from .graphs import DrafterGraph, TargetGraph
from .runtime import META, _names, drafter_rows, packed_metadata

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}

CACHE_IN = {"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
CACHE_OUT = {"present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}


def export_onnx(target_dir: str | Path, drafter_dir: str | Path, out_dir: str | Path, dtype: str = "fp32",
                top_k: int | None = None, page_size: int = 32, max_batch_size: int = 8, kv_tokens: int = 16384) -> Path:
    """Write OUT_DIR (see the module docstring). `page_size` is the KV page (engine.dynamic_batching.
    block_size; static in the drafter graph), `max_batch_size` and `kv_tokens` size og.Engine's pools."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be fp32 or bf16, got {dtype!r}")
    for name, value in (("page-size", page_size), ("max-batch-size", max_batch_size), ("kv-tokens", kv_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {value!r}")
    # bf16: weights are stored in bf16 and cast to fp32 where used — onnxruntime's CPU provider has
    # no bf16 MatMul/Gemm kernels, so compute, caches and I/O stay fp32 (edge math is fp32 anyway)
    weights_bf16 = DTYPES[dtype] == torch.bfloat16
    torch_dtype = torch.float32
    target = load_target(Path(target_dir), torch_dtype)       # validates the target checkpoint
    if not family_of(target.config.architecture).capabilities.onnx_export:
        raise ConfigError(f"export onnx: {target.config.architecture} targets are not exported (ONNX Runtime "
                          "GenAI's paged graph contract covers Llama/Qwen3 decoders, with no per-sequence layer "
                          "state); run them in blockdraft")
    drafter = load_drafter(Path(drafter_dir), target, target_dir=target_dir)   # validates taps, fc width, vocab, heads
    cfg = drafter.config
    kind = drafter_kind(cfg.kind)
    if kind.onnx is None:
        exported = " and ".join(kinds.names(lambda k: k.onnx is not None))
        raise ConfigError(f"export onnx writes the ORT-GenAI lattice contract, which covers {exported} "
                          f"drafters; {drafter_dir} resolves to kind={cfg.kind!r}")
    if kind.onnx.fixed_top_k is not None:
        fixed = getattr(cfg.heads, kind.onnx.fixed_top_k)
        if top_k is not None and top_k != fixed:
            raise ConfigError(f"--top-k {top_k}: a {kind.name} drafter's lattice is trained for "
                              f"{kind.onnx.fixed_top_k}={fixed}; omit --top-k or pass that value")
        top_k = fixed
    top_k = 8 if top_k is None else top_k
    if not 1 <= top_k <= cfg.vocab_size:
        raise ConfigError(f"--top-k must be in [1, vocab_size={cfg.vocab_size}], got {top_k}")
    window = shared_window(cfg)
    if kind.onnx.one_window and window is None:
        raise ConfigError(f"{drafter_dir}: a {kind.name} drafter exports only when every layer slides with one "
                          f"window (ONNX Runtime GenAI 0.18 requires model.{kind.name}.sliding_window > 0 and gives all "
                          f"layers one ring); layer windows are {[cfg.layer_window(i) for i in range(cfg.num_layers)]}")
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    t, d = target.config, cfg
    graph_name = f"{d.kind}.onnx"
    # example inputs: two requests, 3 new rows after 0 committed and 2 after 2 (pages [0, 1] and [2])
    def example(rows):
        return {k: torch.from_numpy(v) for k, v in packed_metadata([0, 2], rows, [[0, 1], [2]]).items()}

    meta = example([3, 2])
    seq_axes = {"cumulative_sequence_lengths": {0: "batch_plus_1"}, "past_sequence_lengths": {0: "batch"},
                "block_table": {0: "batch", 1: "max_blocks"}}

    def pools(layers, heads, dim):
        names_in, names_out = _names(CACHE_IN, "past", layers), _names(CACHE_OUT, "present", layers)
        tensors = [torch.zeros(4, page_size, heads, dim) for _ in names_in]
        axes = {n: {0: "num_blocks"} for n in names_in + names_out}
        return names_in, names_out, tensors, axes

    t_in, t_out, t_pools, t_axes = pools(t.num_layers, t.num_kv_heads, t.head_dim)
    _export(TargetGraph(target, cfg.taps), (torch.tensor([1, 2, 3, 4, 5]), *meta.values(), *t_pools),
            tmp / "model.onnx", ["input_ids", *meta, *t_in], ["logits", "aux_hidden_states", *t_out],
            {"input_ids": {0: "num_tokens"}, **seq_axes, **t_axes, "logits": {0: "num_tokens"},
             "aux_hidden_states": {0: "num_tokens"}})
    feat = len(cfg.taps.layers) * t.hidden_size
    d_in, d_out, d_pools, d_axes = pools(d.num_layers, d.num_kv_heads, d.head_dim)
    b = d.block_size
    # the same two requests with 3 and 2 context rows, each followed by a block (og.Engine's packing)
    maps = {k: torch.from_numpy(v) for k, v in drafter_rows([3, 2], [True, True], b).items()}
    d_meta = example([3 + b, 2 + b])
    ids = torch.full((2 * b,), d.mask_token_id)
    ids[::b] = torch.tensor([2, 3])
    _export(DrafterGraph(drafter, top_k),
            (torch.zeros(5, feat), ids, maps["q_rows"], maps["qkv_rows"], maps["block_rows"], *d_meta.values(),
             *d_pools),
            tmp / graph_name, ["aux_hidden_states", "input_ids", "q_row_map", "qkv_row_map", "block_row_index",
                               *meta, *d_in], ["draft_candidate_ids", "draft_scores", *d_out],
            {"aux_hidden_states": {0: "num_ctx"}, "input_ids": {0: "num_block"}, "q_row_map": {0: "num_tokens"},
             "qkv_row_map": {0: "num_tokens"}, "block_row_index": {0: "num_block"}, **seq_axes, **d_axes,
             "draft_candidate_ids": {0: "batch"}, "draft_scores": {0: "batch"}})
    n = d.num_draft_tokens
    fix_contract_io(tmp / "model.onnx", ["attention_metadata"])
    fix_contract_io(tmp / graph_name, ["attention_metadata", "q_row_map"],
                    {"draft_candidate_ids": ["batch", n, top_k], "draft_scores": ["batch", n, top_k, top_k]})
    for graph in ("model.onnx", graph_name):
        if weights_bf16:
            weights_to_bf16(tmp / graph)
    share_initializers(tmp, ["model.onnx", graph_name])
    config = genai_config(target, drafter, top_k, window, page_size, max_batch_size, kv_tokens)
    (tmp / "genai_config.json").write_text(json.dumps(config, indent=1) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (Path(target_dir) / name).is_file():
            shutil.copy(Path(target_dir) / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def shared_window(cfg) -> int | None:
    """The one window every layer slides with, else None (a full-attention layer, or mixed windows)."""
    windows = {cfg.layer_window(i) for i in range(cfg.num_layers)}
    return windows.pop() if len(windows) == 1 and None not in windows else None


def _export(module, args, path: Path, inputs, outputs, dynamic_axes) -> None:
    import warnings

    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic_axes, opset_version=18, dynamo=False,
                          do_constant_folding=False)  # folding would rewrite shared weights (transposes)


def weights_to_bf16(path: Path, threshold: int = 1024) -> None:
    """Store every fp32 initializer of >= threshold elements as bf16, with a Cast back to fp32."""
    import ml_dtypes
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    casts = []
    for init in model.graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or int(np.prod(init.dims)) < threshold:
            continue
        values = numpy_helper.to_array(init).astype(ml_dtypes.bfloat16)
        name = init.name
        init.CopyFrom(helper.make_tensor(f"{name}.bf16", onnx.TensorProto.BFLOAT16, list(init.dims),
                                         values.view(np.uint16).tobytes(), raw=True))
        casts.append(helper.make_node("Cast", [f"{name}.bf16"], [name], to=onnx.TensorProto.FLOAT,
                                      name=f"{name}.cast"))
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(casts + nodes)
    onnx.save_model(model, str(path))


def share_initializers(folder: Path, names: list[str], threshold: int = 1024) -> None:
    """Store initializers that appear (byte-identical) in several graphs once, in shared_weights.bin,
    as external data both graphs point to; each graph's other large initializers go to GRAPH.data.

    The file is shared, not the memory: og.Engine 0.18 on the CPU provider fails to load a model
    whose drafter lists `shared_initializers` ("GetMemoryInfo for CPU should not be used."), so the
    config lists none and each session maps the tensors itself."""
    import onnx
    from onnx.external_data_helper import set_external_data

    models = {n: onnx.load(str(folder / n)) for n in names}
    owners: dict[str, list] = {}
    for n, m in models.items():
        for init in m.graph.initializer:
            if len(init.raw_data) >= threshold:
                owners.setdefault(hashlib.sha256(init.raw_data).hexdigest(), []).append((n, init))
    offset = 0
    with open(folder / "shared_weights.bin", "wb") as out:
        for digest, uses in owners.items():
            if len({n for n, _ in uses}) < 2:
                continue
            data = uses[0][1].raw_data
            out.write(data)
            for n, init in uses:
                set_external_data(init, "shared_weights.bin", offset, len(data))
                init.ClearField("raw_data")
                init.data_location = onnx.TensorProto.EXTERNAL
            offset += len(data)
    for n, m in models.items():
        own, own_offset = folder / f"{n}.data", 0
        with open(own, "wb") as f:
            for init in m.graph.initializer:
                if init.HasField("raw_data") and len(init.raw_data) >= threshold:
                    f.write(init.raw_data)
                    set_external_data(init, own.name, own_offset, len(init.raw_data))
                    own_offset += len(init.raw_data)
                    init.ClearField("raw_data")
                    init.data_location = onnx.TensorProto.EXTERNAL
        onnx.save_model(m, str(folder / n))


def fix_contract_io(path: Path, unused_inputs: list[str], output_dims: dict[str, list] | None = None) -> None:
    """Declare the contract inputs the graph does not read (the exporter drops them), so a runtime that
    binds the contract's names finds them: `attention_metadata` (bounds a kernel would use; the masks
    here are exact) and the drafter's `q_row_map` (queries are computed for block rows only). Write
    the static sizes the contract fixes into outputs the exporter left symbolic (og.Engine checks
    `[batch, n, K]` / `[batch, n, K, K]`)."""
    import onnx
    from onnx import TensorProto, helper

    shapes = {"attention_metadata": [3], "q_row_map": ["num_tokens"]}
    model = onnx.load(str(path), load_external_data=False)
    have = {i.name for i in model.graph.input}
    for name in unused_inputs:
        if name not in have:
            model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.INT32, shapes[name]))
    for out in model.graph.output:
        for dim, want in zip(out.type.tensor_type.shape.dim, (output_dims or {}).get(out.name, [])):
            if isinstance(want, int):
                dim.dim_value = want
            else:
                dim.dim_param = want
    onnx.save_model(model, str(path))


def genai_config(target, drafter, top_k: int, window: int | None, page_size: int,
                 max_batch_size: int, kv_tokens: int) -> dict:
    """genai_config.json in ONNX Runtime GenAI 0.18's schema: only keys its parser accepts."""
    t, d = target.config, drafter.config
    meta = {n: n for n in META}
    decoder = {
        "filename": "model.onnx", "hidden_size": t.hidden_size, "num_attention_heads": t.num_heads,
        "num_hidden_layers": t.num_layers, "num_key_value_heads": t.num_kv_heads, "head_size": t.head_dim,
        "inputs": {"input_ids": "input_ids", **meta, **CACHE_IN},
        "outputs": {"logits": "logits", "aux_hidden_states": "aux_hidden_states", **CACHE_OUT},
    }
    graph = f"{d.kind}.onnx"
    section = {
        "filename": graph, "num_hidden_layers": d.num_layers, "num_key_value_heads": d.num_kv_heads,
        "head_size": d.head_dim, "block_size": d.block_size, "num_draft_tokens": d.num_draft_tokens,
        "selector_top_k": top_k, "mask_token_id": d.mask_token_id, "sliding_window": window or -1,
        "main_aux_hidden_states": "aux_hidden_states", "aux_hidden_state_layers": list(d.taps.layers),
        "inputs": {"aux_hidden_states": "aux_hidden_states", "input_ids": "input_ids", "q_row_map": "q_row_map",
                   "qkv_row_map": "qkv_row_map", "block_row_index": "block_row_index", **meta, **CACHE_IN},
        "outputs": {"candidate_ids": "draft_candidate_ids", "scores": "draft_scores", **CACHE_OUT},
    }
    eos = list(t.eos_token_ids)
    return {"model": {"type": t.architecture, "vocab_size": t.vocab_size, "context_length": t.max_position_embeddings,
                      "eos_token_id": eos if len(eos) != 1 else eos[0], "decoder": decoder, d.kind: section},
            "engine": {"dynamic_batching": {"block_size": page_size, "max_batch_size": max_batch_size,
                                            "num_blocks": -(-kv_tokens // page_size), "prefix_caching": False}},
            "search": {"max_length": t.max_position_embeddings, "do_sample": False},
            "speculative": {"max_draft_tokens": min(16, d.num_draft_tokens)}}
