"""The per-core L2 size read from sysfs (`cpu_cache_sizes.py`), and what follows it
(`platforms/cpu.py`): the float32 step budget and the attention kernel's order for float32
single-token decodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedserve.services.gpu_worker.cpu_cache_sizes import (
    CPU0_CACHES,
    l2_bytes_per_core,
    parse_cache_size,
)
from pagedserve.services.gpu_worker.platforms import cpu as cpu_platform
from pagedserve.services.gpu_worker.platforms.cpu import (
    FUSED_FP32_STEP_TOKENS,
    SMALL_L2_FP32_STEP_TOKENS,
    CpuPlatform,
    fused_fp32_step_tokens,
    single_decodes_by_sequence,
)


def _cache(root: Path, index: int, level: int, kind: str, size: str) -> None:
    entry = root / f"index{index}"
    entry.mkdir(parents=True)
    (entry / "level").write_text(f"{level}\n")
    (entry / "type").write_text(f"{kind}\n")
    (entry / "size").write_text(f"{size}\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512K", 512 << 10), ("2048K", 2 << 20), ("1M", 1 << 20), ("32768", 32768), ("", None),
     ("lots", None), ("K", None)],
)  # fmt: skip
def test_parse_cache_size(text: str, expected: int | None) -> None:
    assert parse_cache_size(text) == expected


def test_l2_is_the_level_2_data_or_unified_cache(tmp_path: Path) -> None:
    _cache(tmp_path, 0, 1, "Data", "32K")
    _cache(tmp_path, 1, 1, "Instruction", "32K")
    _cache(tmp_path, 2, 2, "Unified", "512K")
    _cache(tmp_path, 3, 3, "Unified", "32768K")
    assert l2_bytes_per_core(tmp_path) == 512 << 10


def test_no_l2_in_sysfs_is_unknown(tmp_path: Path) -> None:
    assert l2_bytes_per_core(tmp_path / "missing") is None
    _cache(tmp_path, 0, 1, "Data", "48K")
    assert l2_bytes_per_core(tmp_path) is None
    (tmp_path / "index1").mkdir()  # an entry sysfs left without its files
    assert l2_bytes_per_core(tmp_path) is None


def test_this_machines_l2_is_read_where_sysfs_lists_one() -> None:
    """Where this machine's sysfs names a level-2 cache, its size is read (not left unknown)."""
    listed = [
        entry
        for entry in CPU0_CACHES.glob("index*")
        if (entry / "level").is_file() and (entry / "level").read_text().strip() == "2"
        and (entry / "type").read_text().strip() in ("Unified", "Data")
    ]  # fmt: skip
    size = l2_bytes_per_core()
    if listed:
        assert size == parse_cache_size((listed[0] / "size").read_text())
        assert size is not None and size >= 64 << 10
    else:
        assert size is None


def test_the_float32_budget_is_smaller_below_1_mib_of_l2() -> None:
    assert fused_fp32_step_tokens(512 << 10) == SMALL_L2_FP32_STEP_TOKENS == 512
    assert fused_fp32_step_tokens(1 << 20) == FUSED_FP32_STEP_TOKENS == 768
    assert fused_fp32_step_tokens(2 << 20) == 768
    assert fused_fp32_step_tokens(None) == 768  # unknown: the budget measured on the Zen 4


def test_single_decodes_go_by_sequence_below_1_mib_of_l2() -> None:
    assert single_decodes_by_sequence(512 << 10) is True  # the Zen 3, where it was faster
    assert single_decodes_by_sequence(1 << 20) is False  # the Zen 4, where by pair was
    assert single_decodes_by_sequence(2 << 20) is False
    assert single_decodes_by_sequence(None) is False  # unknown: as the Zen 4


@pytest.mark.parametrize(("l2_bytes", "by_sequence"), [(512 << 10, True), (1 << 20, False)])
def test_the_worker_sets_the_kernels_order_from_its_l2(monkeypatch, l2_bytes, by_sequence) -> None:
    """`set_up_process` (every CPU worker, before its first step) hands the kernel the order
    its L2 calls for."""
    calls: list[bool] = []
    monkeypatch.setattr(cpu_platform, "l2_bytes_per_core", lambda: l2_bytes)
    monkeypatch.setattr(
        cpu_platform.cpu_paged_attention, "set_single_decodes_by_sequence", calls.append
    )
    threads = torch.get_num_threads()
    try:
        CpuPlatform(torch.device("cpu")).set_up_process(0, 1)
    finally:
        torch.set_num_threads(threads)
    assert calls == [by_sequence]


def test_a_worker_without_the_attention_kernel_starts(monkeypatch) -> None:
    """The kernel switched off: `set_up_process` sets its threads and no order, and raises
    nothing."""
    monkeypatch.setenv("PAGEDSERVE_CPU_ATTENTION_KERNEL", "0")
    cpu_platform.cpu_paged_attention.load.cache_clear()
    threads = torch.get_num_threads()
    try:
        CpuPlatform(torch.device("cpu")).set_up_process(0, 1)
        assert cpu_platform.cpu_paged_attention.load() is None
    finally:
        torch.set_num_threads(threads)
        cpu_platform.cpu_paged_attention.load.cache_clear()
