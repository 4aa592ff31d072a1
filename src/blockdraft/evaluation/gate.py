"""Acceptance gates: a versioned JSON file of reference acceptance lengths, and the check that a
measured AL is at least `tolerance` × the reference (0.95 by default, as TensorRT-LLM's
`acceptance_length.yaml` gates).

A row is keyed by what determines acceptance — model, drafter, prompt set, block size, numerics —
and records how its reference was measured (prompts, max_new_tokens, temperature); a gated run
measures under exactly those conditions. A drafter whose slots collapse keeps every accuracy
number green; only its AL shows it, so the gate names the row it fails.

    {"format": "blockdraft-acceptance-gates", "version": 1, "tolerance": 0.95,
     "rows": [{"model": "smollm2", "drafter": "dspark", "set": "math", "block_size": 8,
               "numerics": "bfloat16/int4", "prompts": 8, "max_new_tokens": 64,
               "temperature": 0.0, "ref_al": 1.73}]}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CheckpointError, ConfigError

FORMAT, VERSION = "blockdraft-acceptance-gates", 1
SHIPPED = Path(__file__).resolve().parents[1] / "assets" / "gates" / "acceptance.json"
KEY_FIELDS = ("model", "drafter", "set", "block_size", "numerics")
CONDITION_FIELDS = ("prompts", "max_new_tokens", "temperature")


@dataclass(frozen=True)
class GateKey:
    model: str
    drafter: str
    set: str
    block_size: int
    numerics: str              # "<dtype>/<weight quantization>", e.g. "bfloat16/int4"

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items())


@dataclass(frozen=True)
class GateRow:
    key: GateKey
    prompts: int
    max_new_tokens: int
    temperature: float
    ref_al: float


@dataclass(frozen=True)
class GateFile:
    path: Path
    tolerance: float
    rows: tuple[GateRow, ...]

    def find(self, key: GateKey) -> GateRow:
        for row in self.rows:
            if row.key == key:
                return row
        have = "; ".join(f"[{r.key}]" for r in self.rows) or "none"
        raise ConfigError(f"{self.path}: no gate row for [{key}]; rows: {have}")


@dataclass(frozen=True)
class GateResult:
    row: GateRow
    measured_al: float
    tolerance: float

    @property
    def threshold(self) -> float:
        return self.tolerance * self.row.ref_al

    @property
    def passed(self) -> bool:
        return self.measured_al >= self.threshold

    def message(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (f"gate {verdict} [{self.row.key}]: mean AL {self.measured_al:.3f} vs "
                f"{self.tolerance:g} x ref {self.row.ref_al:.3f} = {self.threshold:.3f}")

    def as_dict(self) -> dict:
        return {"row": asdict(self.row.key), "ref_al": self.row.ref_al, "measured_al": self.measured_al,
                "threshold": self.threshold, "passed": self.passed}


def _field(raw: dict, name: str, kind, where: str):
    value = raw.get(name)
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok or (kind is not str and value < 0):
        raise ConfigError(f"{where}: field {name!r} must be a {'string' if kind is str else 'number >= 0'}, "
                          f"got {value!r}")
    return value


def load_gates(path: str | Path) -> GateFile:
    """Read and validate a gate file (every error names the row and the field)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"missing gate file: {path}")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise ConfigError(f"{path}: expected format {FORMAT!r} version {VERSION}, got "
                          f"{raw.get('format') if isinstance(raw, dict) else raw!r} "
                          f"version {raw.get('version') if isinstance(raw, dict) else None!r}")
    tolerance = raw.get("tolerance", 0.95)
    if not isinstance(tolerance, (int, float)) or not 0 < tolerance <= 1:
        raise ConfigError(f"{path}: field 'tolerance' must be in (0, 1], got {tolerance!r}")
    rows, seen = [], set()
    for i, r in enumerate(raw.get("rows", [])):
        where = f"{path}: rows[{i}]"
        if not isinstance(r, dict):
            raise ConfigError(f"{where}: must be an object, got {r!r}")
        key = GateKey(*(_field(r, f, str, where) for f in ("model", "drafter", "set")),
                      _field(r, "block_size", int, where), _field(r, "numerics", str, where))
        if key in seen:
            raise ConfigError(f"{where}: duplicate row [{key}]")
        seen.add(key)
        rows.append(GateRow(key, _field(r, "prompts", int, where), _field(r, "max_new_tokens", int, where),
                            float(_field(r, "temperature", (int, float), where)),
                            float(_field(r, "ref_al", (int, float), where))))
    return GateFile(path, float(tolerance), tuple(rows))


def check(gates: GateFile, row: GateRow, measured_al: float) -> GateResult:
    return GateResult(row, measured_al, gates.tolerance)


def record(path: str | Path, row: GateRow) -> None:
    """Write `row` into the gate file at `path` (created if missing), replacing the row with its key."""
    path = Path(path)
    raw = json.loads(path.read_text()) if path.is_file() else {"format": FORMAT, "version": VERSION,
                                                               "tolerance": 0.95, "rows": []}
    if path.is_file():
        load_gates(path)                                   # refuse to extend a malformed file
    entry = {**asdict(row.key), "prompts": row.prompts, "max_new_tokens": row.max_new_tokens,
             "temperature": row.temperature, "ref_al": round(row.ref_al, 4)}
    rows = [r for r in raw["rows"] if tuple(r.get(f) for f in KEY_FIELDS) != tuple(asdict(row.key).values())]
    raw["rows"] = sorted(rows + [entry], key=lambda r: tuple(str(r[f]) for f in KEY_FIELDS))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw, indent=1) + "\n")
