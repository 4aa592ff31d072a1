"""`blockdraft bench --sweep`: every cell of the context × batch matrix reported, plain and
speculative tokens equal, contexts capped at the model's limit, cells past the cache budget refused
by name before any run."""

import json

import pytest
import torch

from blockdraft.cli import main
from conftest import ASSETS

SWEEP = ["bench", "--sweep", "--target", str(ASSETS / "target-qwen3"), "--drafters", f"dspark={ASSETS / 'dspark'}",
         "--max-new-tokens", "8", "--repeats", "1", "--threads", "1"]


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_sweep_reports_every_cell(tmp_path, capsys):
    assert main([*SWEEP, "--contexts", "32,600", "--batches", "1,2", "--out", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report == json.loads((tmp_path / "sweep.json").read_text())
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert "context 600 capped at 498" in err                  # 512 - 8 new tokens - 5 drafts - 1
    assert [(c["context"], c["batch"]) for c in report["cells"]] == [(32, 1), (32, 2), (498, 1), (498, 2)]
    for cell in report["cells"]:
        assert {"context", "batch", "plain_tok_s", "spec_tok_s", "speedup", "mean_al"} <= set(cell)
        assert cell["plain_tok_s"] > 0 and cell["spec_tok_s"] > 0
        assert cell["speedup"] == pytest.approx(cell["spec_tok_s"] / cell["plain_tok_s"])   # one repeat
        assert cell["identical"] and 1 <= cell["mean_al"] <= 6           # lossless; block of 5 drafts
    assert report["complete"]


def test_a_stopped_sweep_keeps_the_cells_it_measured(tmp_path, monkeypatch):
    """sweep.json is rewritten after every cell: a sweep stopped part-way leaves its finished cells on disk."""
    from blockdraft.bench import sweep as sweep_module

    written = []
    real = sweep_module.run_sweep

    def stop_after_two_cells(*args, on_cell=None, **kwargs):
        def record(report):
            written.append(json.loads((tmp_path / "sweep.json").read_text()) if (tmp_path / "sweep.json").exists()
                           else None)
            on_cell(report)
            if len(report["cells"]) == 3:
                raise KeyboardInterrupt
        return real(*args, on_cell=record, **kwargs)

    monkeypatch.setattr(sweep_module, "run_sweep", stop_after_two_cells)
    with pytest.raises(KeyboardInterrupt):
        main([*SWEEP, "--contexts", "32,64", "--batches", "1,2", "--out", str(tmp_path), "--json"])
    kept = json.loads((tmp_path / "sweep.json").read_text())
    assert [(c["context"], c["batch"]) for c in kept["cells"]] == [(32, 1), (32, 2), (64, 1)]
    assert not kept["complete"] and kept["drafter"].endswith("dspark") and written[0] is None   # none before cell 1
    assert sweep_module.sweep_table(kept).splitlines()[-1].endswith("| not run |")   # (64, 2) was never measured
    sweep_module.plot_sweep(kept, tmp_path / "partial.png")
    assert (tmp_path / "partial.png").stat().st_size > 0


def test_cells_past_the_budget_are_refused_by_name_before_any_run(tmp_path, capsys):
    args = [*SWEEP, "--contexts", "32,256", "--batches", "1,4", "--out", str(tmp_path)]
    assert main([*args, "--cache-budget", "400000"]) == 2
    err = capsys.readouterr().err
    assert "2 of 4 cells do not fit the KV cache budget of 400,000 bytes (--cache-budget)" in err
    assert "context=256 batch=1 needs" in err and "context=256 batch=4 needs" in err
    assert "context=32 " not in err and not (tmp_path / "sweep.json").exists()


@pytest.mark.parametrize("args,message", [
    (["--contexts", "32,0"], "--contexts must be >= 1"),
    (["--batches", "x"], "--batches must be comma-separated ints"),
    (["--drafters", "none"], "--sweep compares plain and speculative decoding: it needs a drafter"),
    (["--cache-budget", "0"], "cache_budget_bytes must be >= 1"),
    (["--drafters", f"a={ASSETS / 'dspark'},b={ASSETS / 'dflash'}"], "--sweep compares plain decoding with one "
     "drafter; --drafters names 2"),
])
def test_bad_sweep_flags(tmp_path, capsys, args, message):
    assert main([*SWEEP, *args, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
