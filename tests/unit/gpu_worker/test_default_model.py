"""Default-model conversion: once, atomically, reused afterwards (conversion itself faked here;
tests/unit/test_engine.py runs the real converted model in a slow test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.services.gpu_worker import default_model
from pagedserve.shared.model_files import default_model_dir


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    return tmp_path


def fake_convert(calls: list[Path]):
    def convert(gguf: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (out_dir / name).write_text("{}")

    return convert


def test_converts_once_then_reuses(cache: Path, monkeypatch: pytest.MonkeyPatch):
    calls: list[Path] = []
    monkeypatch.setattr(default_model, "convert_gguf", fake_convert(calls))
    first = default_model.ensure_default_model()
    assert first == default_model_dir() and (first / "model.safetensors").is_file()
    assert calls[0] != first  # written elsewhere, then renamed into place
    assert default_model.ensure_model("smollm2") == first
    assert len(calls) == 1
    assert [p.name for p in cache.iterdir()] == [first.name]  # no temp dir left behind


def test_a_failed_conversion_leaves_nothing(cache: Path, monkeypatch: pytest.MonkeyPatch):
    def broken(gguf: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(default_model, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        default_model.ensure_default_model()
    assert list(cache.iterdir()) == []


def test_an_incomplete_leftover_is_replaced(cache: Path, monkeypatch: pytest.MonkeyPatch):
    target = default_model_dir()
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # no weights: a crash of some older version
    calls: list[Path] = []
    monkeypatch.setattr(default_model, "convert_gguf", fake_convert(calls))
    assert default_model.ensure_default_model() == target
    assert (target / "model.safetensors").is_file() and len(calls) == 1


def test_unknown_model_name_is_a_clear_error(cache: Path):
    with pytest.raises(FileNotFoundError, match="not a known alias"):
        default_model.ensure_model("no-such-model")
