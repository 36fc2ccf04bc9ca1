"""The tuning caches shipped with moekit lie in the package beside its module, and a layer finds the
one of its GPU by name and SM count without any setting (docs/TUNE.md)."""
import os

import pytest

import moekit


def clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("MOEKIT_TUNING_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def test_the_package_ships_the_caches_beside_its_module():
    folder = os.path.join(os.path.dirname(moekit._C.__file__), "tuning")
    assert {"h100.json", "h200.json"} <= set(os.listdir(folder))


def test_the_cache_of_a_gpu_is_found_by_name_and_sm_count(monkeypatch, tmp_path):
    clean_env(monkeypatch, tmp_path)
    folder = os.path.join(os.path.dirname(moekit._C.__file__), "tuning")
    h200 = moekit.tuning_cache(gpu="NVIDIA H200", sms=132)
    assert h200.startswith(os.path.join(folder, "h200.json") + " (shipped with moekit for NVIDIA H200 with 132 SMs;"), h200
    fake = moekit.tuning_cache(gpu="NVIDIA Fake GPU", sms=132)
    assert fake.startswith("none (") and "none shipped for 'NVIDIA Fake GPU' with 132 SMs in " + folder in fake, fake
    monkeypatch.setenv("MOEKIT_TUNING_CACHE", "off")
    assert moekit.tuning_cache(gpu="NVIDIA H200", sms=132) == "none (off (MOEKIT_TUNING_CACHE))"


def test_a_gpu_needs_its_sm_count():
    with pytest.raises(moekit.Error, match=r"sms: expected the GPU's multiprocessor count \(>= 1\) with gpu, given 0"):
        moekit.tuning_cache(gpu="NVIDIA H200")
