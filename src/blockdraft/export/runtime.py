"""Run an export with onnxruntime (CPU) behind the lattice-backend interface.

`OnnxBackend(dir)` reads genai_config.json, opens both graphs and checks the contract
before anything runs: every cache tensor the JSON names exists with the declared dtype,
head count and head size; the lattice outputs are int64 [batch, n, K] and fp32
[batch, n, K, K] with n and K as declared; the taps width matches. A mismatch is a
`ContractError` naming the tensor, the field and both values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..checkpoints.resolve import runtime_json_section
from ..checkpoints.weights import read_json
from ..errors import ConfigError
from ..spec_decode.lattice import Lattice

ORT_TYPES = {"float32": "tensor(float)", "bfloat16": "tensor(bfloat16)", "int64": "tensor(int64)"}


class ContractError(ConfigError):
    """The runtime JSON and the graphs disagree."""


def _meta(session, kind: str) -> dict:
    return {a.name: a for a in (session.get_inputs() if kind == "input" else session.get_outputs())}


def _check(graph: str, metas: dict, name: str, dtype: str, dims: dict[int, int], rank: int) -> None:
    if name not in metas:
        raise ContractError(f"{graph}: tensor {name!r} named in genai_config.json is not in the graph "
                            f"(has {sorted(metas)[:6]}...)")
    meta = metas[name]
    if meta.type != ORT_TYPES[dtype]:
        raise ContractError(f"{graph}: tensor {name!r} dtype is {meta.type}, genai_config.json declares {dtype}")
    if len(meta.shape) != rank:
        raise ContractError(f"{graph}: tensor {name!r} has rank {len(meta.shape)}, the contract needs {rank}")
    for axis, want in dims.items():
        got = meta.shape[axis]
        if isinstance(got, int) and got != want:
            raise ContractError(f"{graph}: tensor {name!r} axis {axis} is {got}, genai_config.json declares {want}")


def _read_runtime(folder: Path) -> tuple[dict, dict, dict, str, dict]:
    """genai_config.json's model, decoder and drafter sections, the drafter kind, and blockdraft.json."""
    path = folder / "genai_config.json"
    runtime = read_json(path, ConfigError)
    kind = runtime_json_section(runtime)["kind"]     # exactly one of model.dspark / model.dflash2
    decoder = runtime["model"].get("decoder")
    if not isinstance(decoder, dict):
        raise ContractError(f"{path}: model.decoder (the target graph) is missing")
    return runtime["model"], decoder, runtime["model"][kind], kind, read_json(folder / "blockdraft.json", ConfigError)


def _field(section: dict, name: str, where: str):
    """section[name], or a named error; `where` is a genai_config.json path or starts with blockdraft.json."""
    if name not in section:
        prefix = "" if where.startswith("blockdraft.json") else "genai_config.json: "
        raise ContractError(f"{prefix}{where}.{name} is missing")
    return section[name]


class OnnxBackend:
    """The exported target and drafter graphs as a `lattice_decode.LatticeBackend`."""

    def __init__(self, folder: str | Path, threads: int | None = None):
        try:
            import onnxruntime as ort
        except ImportError:
            raise ConfigError("--onnx needs onnxruntime: pip install 'blockdraft[onnx]'") from None
        self.folder = Path(folder)
        model, dec, drf, self.kind, side = _read_runtime(self.folder)
        where = f"model.{self.kind}"
        self.vocab_size = int(_field(model, "vocab_size", "model"))
        self.block_size = int(_field(drf, "block_size", where))
        self.num_draft_tokens = int(_field(drf, "num_draft_tokens", where))
        self.mask_token_id = int(_field(drf, "mask_token_id", where))
        self.top_k = int(_field(drf, "selector_top_k", where))
        self.eos_token_ids = list(side.get("eos_token_ids", []))
        self.context_length = int(model.get("context_length", 1 << 30))
        want_n = self.block_size if self.kind == "dspark" else self.block_size - 1
        if self.num_draft_tokens != want_n:
            raise ContractError(f"{where}.num_draft_tokens={self.num_draft_tokens} but a {self.kind} block of "
                                f"block_size={self.block_size} drafts {want_n}")
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.sessions = {}
        for role, section in (("decoder", dec), (self.kind, drf)):
            path = self.folder / _field(section, "filename", f"model.{role}")
            if not path.is_file():
                raise ConfigError(f"missing file: {path}")
            self.sessions[role] = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        try:
            self._check_contract(dec, drf, where, side)
        except KeyError as e:
            raise ContractError(f"genai_config.json: field {e.args[0]!r} is missing") from None
        except TypeError as e:
            raise ContractError(f"genai_config.json: a field has the wrong type ({e})") from None
        self.reset()

    def _check_contract(self, dec: dict, drf: dict, where: str, side: dict) -> None:
        t_sess, d_sess = self.sessions["decoder"], self.sessions[self.kind]
        t_in, t_out, d_in, d_out = _meta(t_sess, "input"), _meta(t_sess, "output"), _meta(d_sess, "input"), \
            _meta(d_sess, "output")
        self.t_dtype = _field(side, "dtype", "blockdraft.json")
        cache = _field(side, "drafter_cache", "blockdraft.json")
        self.d_dtype = _field(cache, "dtype", "blockdraft.json.drafter_cache")
        for dtype, field in ((self.t_dtype, "dtype"), (self.d_dtype, "drafter_cache.dtype")):
            if dtype not in ("float32", "bfloat16"):
                raise ContractError(f"blockdraft.json: {field} must be float32 or bfloat16, got {dtype!r}")
        ti, to, di, do = dec["inputs"], dec["outputs"], drf["inputs"], drf["outputs"]
        self.t_layers = int(_field(dec, "num_hidden_layers", "model.decoder"))
        self.d_layers = int(_field(drf, "num_hidden_layers", where))
        t_heads, t_dim = int(dec["num_key_value_heads"]), int(dec["head_size"])
        d_heads, d_dim = int(drf["num_key_value_heads"]), int(drf["head_size"])
        feat = len(_field(side, "target_layer_ids", "blockdraft.json")) * int(dec["hidden_size"])
        self.t_names = {"ids": ti["input_ids"], "pos": ti["position_ids"], "logits": to["logits"],
                        "taps": to["aux_hidden_states"],
                        "past": [ti[f"past_{kv}_names"] % i for i in range(self.t_layers) for kv in ("key", "value")],
                        "present": [to[f"present_{kv}_names"] % i for i in range(self.t_layers)
                                    for kv in ("key", "value")]}
        d_inputs = _field(side, "drafter_inputs", "blockdraft.json")
        d_pos = _field(d_inputs, "position_ids", "blockdraft.json.drafter_inputs")
        self.d_names = {"taps": di["aux_hidden_states"], "pos": d_pos, "ids": di["input_ids"],
                        "cand": do["candidate_ids"], "scores": do["scores"],
                        "past": [di[f"past_{kv}_names"] % i for i in range(self.d_layers) for kv in ("key", "value")],
                        "present": [do[f"present_{kv}_names"] % i for i in range(self.d_layers)
                                    for kv in ("key", "value")]}
        _check("target.onnx", t_in, self.t_names["ids"], "int64", {}, 2)
        _check("target.onnx", t_in, self.t_names["pos"], "int64", {}, 2)
        _check("target.onnx", t_out, self.t_names["logits"], self.t_dtype, {2: self.vocab_size}, 3)
        _check("target.onnx", t_out, self.t_names["taps"], self.t_dtype, {2: feat}, 3)
        for name in self.t_names["past"]:
            _check("target.onnx", t_in, name, self.t_dtype, {1: t_heads, 3: t_dim}, 4)
        for name in self.t_names["present"]:
            _check("target.onnx", t_out, name, self.t_dtype, {1: t_heads, 3: t_dim}, 4)
        _check("drafter.onnx", d_in, self.d_names["taps"], self.d_dtype, {2: feat}, 3)
        _check("drafter.onnx", d_in, self.d_names["ids"], "int64", {1: self.block_size}, 2)
        _check("drafter.onnx", d_in, self.d_names["pos"], "int64", {}, 2)
        for name in self.d_names["past"]:
            _check("drafter.onnx", d_in, name, self.d_dtype, {1: d_heads, 3: d_dim}, 4)
        for name in self.d_names["present"]:
            _check("drafter.onnx", d_out, name, self.d_dtype, {1: d_heads, 3: d_dim}, 4)
        n, k = self.num_draft_tokens, self.top_k
        _check("drafter.onnx", d_out, self.d_names["cand"], "int64", {1: n, 2: k}, 3)
        _check("drafter.onnx", d_out, self.d_names["scores"], "float32", {1: n, 2: k, 3: k}, 4)
        self.t_cache_shape = (t_heads, t_dim)
        self.d_cache_shape = (d_heads, d_dim)

    def _np(self, x: torch.Tensor, dtype: str) -> np.ndarray:
        if dtype == "bfloat16":
            import ml_dtypes

            return x.float().numpy().astype(ml_dtypes.bfloat16)
        return x.float().numpy()

    @staticmethod
    def _torch(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(x, dtype=np.float32) if x.dtype != np.int64 else x)

    def reset(self) -> None:
        def empty(shape, dtype):
            return self._np(torch.zeros(1, shape[0], 0, shape[1]), dtype)

        self.t_past = [empty(self.t_cache_shape, self.t_dtype) for _ in self.t_names["past"]]
        self.d_past = [empty(self.d_cache_shape, self.d_dtype) for _ in self.d_names["past"]]
        self.t_length = 0
        self.d_length = 0

    def target_step(self, ids: list[int], start: int):
        if start != self.t_length:
            raise RuntimeError(f"target cache holds {self.t_length} rows, step starts at {start}")
        names = self.t_names
        feed = {names["ids"]: np.array([ids], dtype=np.int64),
                names["pos"]: np.arange(start, start + len(ids), dtype=np.int64)[None],
                **dict(zip(names["past"], self.t_past))}
        logits, taps, *present = self.sessions["decoder"].run([names["logits"], names["taps"], *names["present"]],
                                                              feed)
        self._present = present
        return self._torch(logits)[0], self._torch(taps)[0]

    def commit_target(self, length: int) -> None:
        """Keep the first `length` rows of the last step's present K/V (called right after each step)."""
        self.t_past = [p[:, :, :length] for p in self._present]
        self.t_length = length

    def draft(self, new_taps: torch.Tensor, new_start: int, block_ids: list[int]) -> Lattice:
        if new_start != self.d_length:
            raise RuntimeError(f"drafter context holds {self.d_length} rows, new rows start at {new_start}")
        names = self.d_names
        t = new_taps.shape[0]
        feed = {names["taps"]: self._np(new_taps[None], self.d_dtype),
                names["pos"]: np.arange(new_start, new_start + t, dtype=np.int64)[None],
                names["ids"]: np.array([block_ids], dtype=np.int64), **dict(zip(names["past"], self.d_past))}
        cand, scores, *present = self.sessions[self.kind].run([names["cand"], names["scores"], *names["present"]],
                                                              feed)
        self.d_past, self.d_length = present, new_start + t
        return Lattice(torch.from_numpy(cand), torch.from_numpy(scores))
