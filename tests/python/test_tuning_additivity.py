"""scripts/tuning_additivity.py: the additive model (layer = a(GEMM1) + b(GEMM2)) that tells the tuner's
noise in a cache (docs/TUNE.md) — exact tables fit with no residual, one noisy entry stands out."""
import importlib.util
import json
import os

import pytest

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "tuning_additivity.py")


@pytest.fixture(scope="module")
def additivity():
    spec = importlib.util.spec_from_file_location("tuning_additivity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry(times, measured="median of 20 CUDA-graph replays, cold L2, moekit tune"):
    """A cache entry of staged tactics {(gemm1, gemm2): us}, the fastest the winner."""
    ranked = sorted(times.items(), key=lambda kv: kv[1])
    tactics = [{"tactic": f"staged gemm1={g1} gemm2={g2}", "us": us} for (g1, g2), us in ranked]
    return {"problem": {"experts": 256, "hidden": 7168}, "tokens": 4096, "measured": measured,
            "winner": tactics[0], "runners_up": tactics[1:] + [{"tactic": "min-latency", "us": 1.0}]}


def additive(offsets):
    """4 x 4 tactics whose times add up, but for the offsets given."""
    a = {"g1a": 3000.0, "g1b": 3200.0, "g1c": 3500.0, "g1d": 3100.0}
    b = {"g2a": 1400.0, "g2b": 1600.0, "g2c": 1500.0, "g2d": 1450.0}
    return {(x, y): a[x] + b[y] + offsets.get((x, y), 0.0) for x in a for y in b}


def test_staged_times_take_the_staged_tactics_only(additivity):
    table = additivity.staged_times(entry(additive({})))
    assert len(table) == 16 and table[("g1a", "g2a")] == 4400.0


def test_an_additive_table_leaves_no_residual(additivity):
    residuals = additivity.residuals(additivity.staged_times(entry(additive({}))))
    assert max(abs(r) for r in residuals.values()) < 1e-6


def test_one_noisy_entry_stands_out(additivity):
    noisy = ("g1b", "g2a")
    residuals = additivity.residuals(additivity.staged_times(entry(additive({noisy: -400.0}))))
    # Least squares on a full 4 x 4 table leaves (1 - 1/4)^2 of an entry's own error with it
    assert residuals[noisy] == pytest.approx(100 * -400.0 * 9 / 16 / 4200.0, abs=1e-6)
    assert all(abs(r) < abs(residuals[noisy]) / 2 for k, r in residuals.items() if k != noisy)


def test_the_report_names_how_each_entry_was_timed(additivity, tmp_path, capsys):
    cache = tmp_path / "cache.json"
    side = entry(additive({}), "median of 20 CUDA-graph replays interleaved with the other tactics', cold L2")
    cache.write_text(json.dumps({"entries": [entry(additive({("g1a", "g2b"): 300.0})), side]}))
    additivity.main([str(cache)])
    rows = capsys.readouterr().out.splitlines()[1:]
    assert len(rows) == 2
    assert rows[0].endswith("one after another") and rows[1].endswith("side by side")
