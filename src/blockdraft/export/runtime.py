"""Run an export directory's graphs with onnxruntime (CPU), every scheduled request in one call.

`OnnxModels(dir)` reads the same genai_config.json og.Engine reads, opens both graphs and checks
the contract before anything runs: every input and output the JSON names exists with the dtype,
rank and static sizes the contract fixes (packed int64 ids, int32 metadata, pools `[num_blocks,
page, kv_heads, head_dim]` with the drafter's page = `engine.dynamic_batching.block_size`,
int32 candidates `[batch, n, K]`, fp32 scores `[batch, n, K, K]`, equal tap widths). A mismatch
is a `ContractError` naming the tensor, the field and both values.

Each pool is bound as both past and present, so the graphs write the new rows in place (as
og.Engine runs them). The engine drives it (`engine/onnx_runner.py`); `tests/lattice_oracle.py`
runs one sequence through it as the oracle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..checkpoints.resolve import runtime_json_section
from ..checkpoints.weights import read_json
from ..drafters.registry import drafter_kind
from ..errors import ConfigError
from ..spec_decode.lattice import Lattice

ORT_TYPES = {"float32": "tensor(float)", "bfloat16": "tensor(bfloat16)", "int64": "tensor(int64)",
             "int32": "tensor(int32)"}
NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
META = ("cumulative_sequence_lengths", "past_sequence_lengths", "block_table", "attention_metadata")


class ContractError(ConfigError):
    """genai_config.json and the graphs disagree."""


def _check(graph: str, metas: dict, name: str, dtypes: tuple[str, ...], dims: dict[int, int], rank: int) -> None:
    if name not in metas:
        raise ContractError(f"{graph}: tensor {name!r} named in genai_config.json is not in the graph "
                            f"(has {sorted(metas)[:6]}...)")
    meta = metas[name]
    if meta.type not in [ORT_TYPES[d] for d in dtypes]:
        raise ContractError(f"{graph}: tensor {name!r} dtype is {meta.type}, the contract needs {' or '.join(dtypes)}")
    if len(meta.shape) != rank:
        raise ContractError(f"{graph}: tensor {name!r} has rank {len(meta.shape)}, the contract needs {rank}")
    for axis, want in dims.items():
        got = meta.shape[axis]
        if isinstance(got, int) and got != want:
            raise ContractError(f"{graph}: tensor {name!r} axis {axis} is {got}, genai_config.json declares {want}")


def _field(section: dict, name: str, where: str):
    """section[name], or a named error."""
    if name not in section:
        raise ContractError(f"genai_config.json: {where + '.' if where else ''}{name} is missing")
    return section[name]


def _names(section: dict, key: str, layers: int) -> list[str]:
    """The %d templates of past/present K/V names -> [layer0.key, layer0.value, ...]."""
    return [section[f"{key}_{kv}_names"] % i for i in range(layers) for kv in ("key", "value")]


class _Graph:
    """One session with its pools bound in place; feeds and outputs by the contract's role names."""

    def __init__(self, session, names: dict, outputs: list[str], past: list[str], present: list[str], pages: int,
                 page: int, fill: float):
        import onnxruntime as ort

        self.session, self.names = session, names
        metas = {m.name: m for m in session.get_inputs()}
        self.io = session.io_binding()
        self.pools, self.outputs = {}, [names[role] for role in outputs]
        for p_in, p_out in zip(past, present):
            meta = metas[p_in]
            pool = ort.OrtValue.ortvalue_from_numpy(np.full((pages, page, *meta.shape[2:]), fill, NUMPY[meta.type]))
            self.io.bind_ortvalue_input(p_in, pool)
            self.pools[p_out] = pool

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """-> the outputs named at construction, in that order."""
        for role, value in feed.items():
            self.io.bind_cpu_input(self.names[role], value)
        self.io.clear_binding_outputs()
        for name, pool in self.pools.items():
            self.io.bind_ortvalue_output(name, pool)                       # present aliases past: in place
        for name in self.outputs:
            self.io.bind_output(name)                                      # a fresh buffer each run
        self.session.run_with_iobinding(self.io)
        return [v.numpy() for v in self.io.get_outputs()[len(self.pools):]]


def packed_metadata(pasts: list[int], rows: list[int], tables: list[list[int]]) -> dict[str, np.ndarray]:
    """The contract's sequence metadata for requests with `pasts[i]` committed rows, `rows[i]` new ones
    and pages `tables[i]` (padded with -1 to the longest)."""
    width = max(len(t) for t in tables)
    totals = [p + r for p, r in zip(pasts, rows)]
    return {"cumulative_sequence_lengths": np.cumsum([0, *rows], dtype=np.int32),
            "past_sequence_lengths": np.array(pasts, np.int32),
            "block_table": np.array([t + [-1] * (width - len(t)) for t in tables], np.int32),
            "attention_metadata": np.array([max(rows), max(totals), min(totals)], np.int32)}


def drafter_rows(contexts: list[int], blocks: list[bool], block_size: int) -> dict[str, np.ndarray]:
    """og.Engine's packed drafter stream: per request its `contexts[i]` new context rows, then its
    block (when `blocks[i]`). -> q_row_map, qkv_row_map, block_row_index."""
    n_block_rows = block_size * sum(blocks)
    q_rows, qkv_rows, block_rows = [], [], []
    ctx = slot = packed = 0
    for c, has_block in zip(contexts, blocks):
        q_rows += [slot * block_size if has_block else 0] * c
        qkv_rows += range(n_block_rows + ctx, n_block_rows + ctx + c)
        ctx, packed = ctx + c, packed + c
        if has_block:
            q_rows += range(slot * block_size, (slot + 1) * block_size)
            qkv_rows += range(slot * block_size, (slot + 1) * block_size)
            block_rows += range(packed, packed + block_size)
            slot, packed = slot + 1, packed + block_size
    return {"q_rows": np.array(q_rows, np.int32), "qkv_rows": np.array(qkv_rows, np.int32),
            "block_rows": np.array(block_rows, np.int32)}


class OnnxModels:
    """An export directory's two graphs, contract-checked, over pools of pages the caller sizes
    (`allocate`): one call runs every scheduled request (packed rows, block tables)."""

    def __init__(self, folder: str | Path, threads: int | None = None):
        try:
            import onnxruntime as ort
        except ImportError:
            raise ConfigError("--onnx needs onnxruntime: pip install 'blockdraft[onnx]'") from None
        self.folder = Path(folder)
        path = self.folder / "genai_config.json"
        runtime = read_json(path, ConfigError)
        self.kind = runtime_json_section(runtime)["kind"]     # exactly one of model.dspark / model.dflash2
        model = runtime["model"]
        dec, drf = model.get("decoder"), model[self.kind]
        if not isinstance(dec, dict):
            raise ContractError(f"{path}: model.decoder (the target graph) is missing")
        where = f"model.{self.kind}"
        self.vocab_size = int(_field(model, "vocab_size", "model"))
        self.block_size = int(_field(drf, "block_size", where))
        self.num_draft_tokens = int(_field(drf, "num_draft_tokens", where))
        self.mask_token_id = int(_field(drf, "mask_token_id", where))
        self.top_k = int(_field(drf, "selector_top_k", where))
        eos = model.get("eos_token_id", [])
        self.eos_token_ids = list(eos) if isinstance(eos, list) else [eos]
        self.page = int(_field(_field(_field(runtime, "engine", ""), "dynamic_batching", "engine"),
                               "block_size", "engine.dynamic_batching"))
        self.context_length = int(_field(model, "context_length", "model"))
        self.dims = {"decoder": dec, self.kind: drf}
        want_n = self.block_size if drafter_kind(self.kind).shift_label else self.block_size - 1
        if self.num_draft_tokens != want_n:
            raise ContractError(f"{where}.num_draft_tokens={self.num_draft_tokens} but a {self.kind} block of "
                                f"block_size={self.block_size} drafts {want_n}")
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        sessions = {}
        for role, section in (("decoder", dec), (self.kind, drf)):
            graph = self.folder / _field(section, "filename", f"model.{role}")
            if not graph.is_file():
                raise ConfigError(f"missing file: {graph}")
            sessions[role] = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
        try:
            self._contract = self._check_contract(sessions, dec, drf, where)
        except KeyError as e:
            raise ContractError(f"genai_config.json: field {e.args[0]!r} is missing") from None
        except TypeError as e:
            raise ContractError(f"genai_config.json: a field has the wrong type ({e})") from None
        self.sessions = sessions

    def allocate(self, target_pages: int, drafter_pages: int, fill: float = 0.0) -> None:
        """Pools of `target_pages` / `drafter_pages` pages; `fill`: what unwritten pages hold (a test
        fills them with NaN: the graphs must never let them through)."""
        t_names, d_names, t_pools, d_pools = self._contract
        self.target = _Graph(self.sessions["decoder"], t_names, ["logits", "taps"], *t_pools, target_pages,
                             self.page, fill)
        self.drafter = _Graph(self.sessions[self.kind], d_names, ["cand", "scores"], *d_pools, drafter_pages,
                              self.page, fill)

    def run_target(self, ids: list[int], pasts: list[int], rows: list[int], tables: list[list[int]]):
        """Packed ids of every request -> logits [T, V] fp32, taps [T, F]."""
        feed = {"ids": np.array(ids, dtype=np.int64), **packed_metadata(pasts, rows, tables)}
        logits, taps = self.target.run(feed)
        return torch.from_numpy(logits), torch.from_numpy(np.asarray(taps, dtype=np.float32))

    def run_drafter(self, taps: torch.Tensor, block_ids: list[int], pasts: list[int], contexts: list[int],
                    blocks: list[bool], tables: list[list[int]]) -> Lattice:
        """Context rows taps [C, F] (request by request), the blocks' ids (anchor, mask, ...) of the
        requests with `blocks[i]` -> their lattices [NB, n, K] / [NB, n, K, K]."""
        rows = [c + self.block_size * b for c, b in zip(contexts, blocks)]
        feed = {"taps": taps.float().numpy(), "ids": np.array(block_ids, dtype=np.int64),
                **drafter_rows(contexts, blocks, self.block_size), **packed_metadata(pasts, rows, tables)}
        cand, scores = self.drafter.run(feed)
        return Lattice(torch.from_numpy(cand).long(), torch.from_numpy(scores))

    def _check_contract(self, sessions, dec: dict, drf: dict, where: str):
        t_sess, d_sess = sessions["decoder"], sessions[self.kind]
        meta = lambda s, kind: {a.name: a for a in (s.get_inputs() if kind == "in" else s.get_outputs())}
        t_in, t_out, d_in, d_out = meta(t_sess, "in"), meta(t_sess, "out"), meta(d_sess, "in"), meta(d_sess, "out")
        ti, to, di, do = dec["inputs"], dec["outputs"], drf["inputs"], drf["outputs"]
        t_layers = int(_field(dec, "num_hidden_layers", "model.decoder"))
        d_layers = int(_field(drf, "num_hidden_layers", where))
        t_heads, t_dim = int(dec["num_key_value_heads"]), int(dec["head_size"])
        d_heads, d_dim = int(drf["num_key_value_heads"]), int(drf["head_size"])
        t_names = {"ids": ti["input_ids"], "logits": to["logits"], "taps": to["aux_hidden_states"],
                   **{m: ti[m] for m in META}}
        d_names = {"taps": di["aux_hidden_states"], "ids": di["input_ids"], "q_rows": di["q_row_map"],
                   "qkv_rows": di["qkv_row_map"], "block_rows": di["block_row_index"],
                   "cand": do["candidate_ids"], "scores": do["scores"], **{m: di[m] for m in META}}
        t_pools = (_names(ti, "past", t_layers), _names(to, "present", t_layers))
        d_pools = (_names(di, "past", d_layers), _names(do, "present", d_layers))
        graph_t, graph_d = dec["filename"], drf["filename"]
        _check(graph_t, t_in, t_names["ids"], ("int64",), {}, 1)
        _check(graph_d, d_in, d_names["ids"], ("int64",), {}, 1)
        for metas, names, graph in ((t_in, t_names, graph_t), (d_in, d_names, graph_d)):
            for m in META:
                _check(graph, metas, names[m], ("int32",), {0: 3} if m == "attention_metadata" else {},
                       2 if m == "block_table" else 1)
        for role in ("q_rows", "qkv_rows", "block_rows"):
            _check(graph_d, d_in, d_names[role], ("int32",), {}, 1)
        _check(graph_t, t_out, t_names["logits"], ("float32",), {1: self.vocab_size}, 2)
        _check(graph_t, t_out, t_names["taps"], ("float32",), {}, 2)
        feat = t_out[t_names["taps"]].shape[1]
        _check(graph_d, d_in, d_names["taps"], ("float32",), {1: feat} if isinstance(feat, int) else {}, 2)
        self.tap_width = d_in[d_names["taps"]].shape[1]
        for metas, names, heads, dim, graph, page in ((t_in, t_pools[0], t_heads, t_dim, graph_t, {}),
                                                       (t_out, t_pools[1], t_heads, t_dim, graph_t, {}),
                                                       (d_in, d_pools[0], d_heads, d_dim, graph_d, {1: self.page}),
                                                       (d_out, d_pools[1], d_heads, d_dim, graph_d, {1: self.page})):
            for name in names:
                _check(graph, metas, name, ("float32",), {2: heads, 3: dim, **page}, 4)
        n, k = self.num_draft_tokens, self.top_k
        _check(graph_d, d_out, d_names["cand"], ("int32",), {1: n, 2: k}, 3)
        _check(graph_d, d_out, d_names["scores"], ("float32",), {1: n, 2: k, 3: k}, 4)
        return t_names, d_names, t_pools, d_pools


