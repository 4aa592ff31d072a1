"""Where the benchmark scripts put what they measured: `benchmarks/results/NAME.json` (not in git)
and, for the figures docs/benchmarks.md cites, `docs/data/NAME.png`."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_results(name: str, report: dict) -> Path:
    """`report` as benchmarks/results/NAME.json."""
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def new_figure(**subplots):
    """(fig, axes) from `plt.subplots(**subplots)` on the Agg backend, or None without matplotlib
    (the bench extra): a benchmark still writes its JSON."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(**subplots)


def save_figure(fig, name: str) -> None:
    """`fig` as docs/data/NAME.png (the figures docs/benchmarks.md cites)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "data" / f"{name}.png", dpi=110)
    plt.close(fig)
