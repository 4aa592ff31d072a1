"""`blockdraft export onnx`: target + drafter graphs, shared initializers, runtime JSON.

Layout of OUT_DIR:
  target.onnx (+ target.onnx.data)     logits, packed taps (`hidden_states`), present K/V
  drafter.onnx (+ drafter.onnx.data)   candidate lattice + present drafter K/V
  shared_weights.bin                   tensors both graphs use (the target's embedding and LM head),
                                       stored once and referenced by both as external initializers
  genai_config.json                    ONNX Runtime GenAI 0.18's config, only keys its parser accepts
                                       (`model.decoder` + `model.dspark` | `model.dflash2`, never both;
                                       `speculative.max_draft_tokens`); `og.Config` loads it (tested)
  blockdraft.json                      what blockdraft's backend needs beyond that: graph dtypes, tap
                                       layers, drafter cache layout, input names of this graph layout
  tokenizer.json, tokenizer_config.json (copied from the target)

The graphs themselves still follow blockdraft's own layout (contiguous growing KV, 3-D taps,
int64 candidates), not ORT-GenAI's paged one (`docs/ortgenai_contract.md`), so og.Engine cannot
run them yet; DFlash2 without a sliding window is refused, as the 0.18 runtime refuses it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from ..errors import ConfigError
from ..loading import load_drafter, load_target
from .graphs import DrafterGraph, TargetGraph

LATTICE_KINDS = ("dspark", "dflash2")
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
ONNX_DTYPE = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def cache_names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(n) for kv in ("key", "value")]


def export_onnx(target_dir: str | Path, drafter_dir: str | Path, out_dir: str | Path, dtype: str = "fp32",
                top_k: int | None = None, opset: int = 18) -> Path:
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be fp32 or bf16, got {dtype!r}")
    # bf16: weights are stored in bf16 and cast to fp32 where used — onnxruntime's CPU provider has
    # no bf16 MatMul/Gemm kernels, so compute, caches and I/O stay fp32 (edge math is fp32 anyway)
    weights_bf16 = DTYPES[dtype] == torch.bfloat16
    torch_dtype = torch.float32
    target = load_target(Path(target_dir), torch_dtype)       # validates the target checkpoint
    drafter = load_drafter(Path(drafter_dir), target)          # validates taps, fc width, vocab, heads
    cfg = drafter.config
    if cfg.kind not in LATTICE_KINDS:
        raise ConfigError(f"export onnx writes the ORT-GenAI lattice contract, which covers dspark and dflash2 "
                          f"drafters; {drafter_dir} resolves to kind={cfg.kind!r}")
    if cfg.kind == "dflash2":
        if not any(cfg.layer_window(i) for i in range(cfg.num_layers)):
            raise ConfigError(f"{drafter_dir}: a dflash2 drafter without a sliding window cannot be exported: "
                              "ONNX Runtime GenAI 0.18 requires model.dflash2.sliding_window > 0")
        if top_k is not None and top_k != cfg.selector_top_k:
            raise ConfigError(f"--top-k {top_k}: a dflash2 selector is trained for selector_top_k="
                              f"{cfg.selector_top_k}; omit --top-k or pass that value")
        top_k = cfg.selector_top_k
    top_k = 8 if top_k is None else top_k
    if not 1 <= top_k <= cfg.vocab_size:
        raise ConfigError(f"--top-k must be in [1, vocab_size={cfg.vocab_size}], got {top_k}")
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    taps = cfg.taps
    t, d = target.config, cfg
    tgt_past = [torch.zeros(1, t.num_kv_heads, 2, t.head_dim, dtype=torch_dtype) for _ in range(2 * t.num_layers)]
    tgt_in = cache_names("past_key_values", t.num_layers)
    tgt_out = cache_names("present", t.num_layers)
    _export(TargetGraph(target, taps), (torch.tensor([[1, 2, 3]]), torch.tensor([[2, 3, 4]]), *tgt_past),
            tmp / "target.onnx", ["input_ids", "position_ids", *tgt_in], ["logits", "hidden_states", *tgt_out],
            {"input_ids": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"},
             **{n: {0: "batch", 2: "past_seq"} for n in tgt_in}, **{n: {0: "batch", 2: "total_seq"} for n in tgt_out}},
            opset)
    feat = len(taps.layers) * t.hidden_size
    dr_past = [torch.zeros(1, d.num_kv_heads, 2, d.head_dim, dtype=torch_dtype) for _ in range(2 * d.num_layers)]
    dr_in = cache_names("past_key_values", d.num_layers)
    dr_out = cache_names("present", d.num_layers)
    block = torch.full((1, d.block_size), d.mask_token_id)
    _export(DrafterGraph(drafter, top_k), (torch.zeros(1, 3, feat, dtype=torch_dtype), torch.tensor([[2, 3, 4]]),
                                           block, *dr_past),
            tmp / "drafter.onnx", ["hidden_states", "position_ids", "input_ids", *dr_in],
            ["draft_candidate_ids", "draft_scores", *dr_out],
            {"hidden_states": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"}, "input_ids": {0: "batch"},
             **{n: {0: "batch", 2: "past_seq"} for n in dr_in}, **{n: {0: "batch", 2: "total_seq"} for n in dr_out},
             "draft_candidate_ids": {0: "batch"}, "draft_scores": {0: "batch"}},
            opset)
    if weights_bf16:
        for graph in ("target.onnx", "drafter.onnx"):
            weights_to_bf16(tmp / graph)
    shared = share_initializers(tmp, ["target.onnx", "drafter.onnx"])
    (tmp / "genai_config.json").write_text(json.dumps(genai_config(target, drafter, top_k, shared), indent=1) + "\n")
    side = blockdraft_json(target, drafter, torch_dtype)
    side["weights_dtype"] = "bfloat16" if weights_bf16 else "float32"
    (tmp / "blockdraft.json").write_text(json.dumps(side, indent=1) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (Path(target_dir) / name).is_file():
            shutil.copy(Path(target_dir) / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _export(module, args, path: Path, inputs, outputs, dynamic_axes, opset: int) -> None:
    import warnings

    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic_axes, opset_version=opset, dynamo=False,
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


def share_initializers(folder: Path, names: list[str], threshold: int = 1024) -> dict[str, list[dict]]:
    """Store initializers that appear (byte-identical) in several graphs once, in shared_weights.bin,
    as external data both graphs point to; each graph's other large initializers go to GRAPH.data.
    Returns, per graph, its shared tensors as ORT-GenAI's `shared_initializers` entries."""
    import onnx
    from onnx.external_data_helper import set_external_data

    models = {n: onnx.load(str(folder / n)) for n in names}
    owners: dict[str, list] = {}
    for n, m in models.items():
        for init in m.graph.initializer:
            if len(init.raw_data) >= threshold:
                owners.setdefault(hashlib.sha256(init.raw_data).hexdigest(), []).append((n, init))
    shared: dict[str, list[dict]] = {n: [] for n in names}
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
                shared[n].append({"name": init.name, "data_file": "shared_weights.bin", "offset": str(offset),
                                  "length": str(len(data)), "data_type": init.data_type, "shape": list(init.dims)})
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
    return {n: sorted(entries, key=lambda e: e["name"]) for n, entries in shared.items()}


def genai_config(target, drafter, top_k: int, shared: dict[str, list[dict]]) -> dict:
    """genai_config.json in ONNX Runtime GenAI 0.18's schema: only keys its parser accepts."""
    t, d = target.config, drafter.config
    cache_in = {"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    cache_out = {"present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
    decoder = {
        "filename": "target.onnx", "hidden_size": t.hidden_size, "num_attention_heads": t.num_heads,
        "num_hidden_layers": t.num_layers, "num_key_value_heads": t.num_kv_heads, "head_size": t.head_dim,
        "inputs": {"input_ids": "input_ids", "position_ids": "position_ids", **cache_in},
        "outputs": {"logits": "logits", "aux_hidden_states": "hidden_states", **cache_out},
        "shared_initializers": shared["target.onnx"],
    }
    section = {
        "filename": "drafter.onnx", "num_hidden_layers": d.num_layers, "num_key_value_heads": d.num_kv_heads,
        "head_size": d.head_dim, "block_size": d.block_size, "num_draft_tokens": d.num_draft_tokens,
        "selector_top_k": top_k, "mask_token_id": d.mask_token_id, "sliding_window": d.sliding_window or -1,
        "main_aux_hidden_states": "hidden_states", "aux_hidden_state_layers": list(d.target_layer_ids),
        "inputs": {"aux_hidden_states": "hidden_states", "input_ids": "input_ids", **cache_in},
        "outputs": {"candidate_ids": "draft_candidate_ids", "scores": "draft_scores", **cache_out},
        "shared_initializers": shared["drafter.onnx"],
    }
    eos = list(t.eos_token_ids)
    return {"model": {"type": t.architecture, "vocab_size": t.vocab_size, "context_length": t.max_position_embeddings,
                      "eos_token_id": eos if len(eos) != 1 else eos[0], "decoder": decoder, d.kind: section},
            "speculative": {"max_draft_tokens": min(16, d.num_draft_tokens)}}


def blockdraft_json(target, drafter, dtype: torch.dtype) -> dict:
    """What blockdraft's onnxruntime backend reads beyond genai_config.json (ORT-GenAI refuses these keys)."""
    t, d = target.config, drafter.config
    layers = [{"kind": "ring" if layer.window else "full", "window": layer.window} for layer in drafter.layers]
    return {"format": 1, "kind": d.kind, "dtype": ONNX_DTYPE[dtype], "eos_token_ids": list(t.eos_token_ids),
            "target_layer_ids": list(d.target_layer_ids), "tap_layers": list(d.taps.layers),
            "shift_label": d.shift_label, "drafter_hidden_size": d.hidden_size,
            "markov_rank": d.markov_rank if d.kind == "dspark" else None,
            "drafter_cache": {"dtype": ONNX_DTYPE[dtype], "layers": layers},
            "drafter_inputs": {"position_ids": "position_ids"}}   # ORT-GenAI's drafter inputs have no positions
