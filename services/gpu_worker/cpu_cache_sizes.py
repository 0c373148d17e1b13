"""The CPU's per-core L2 cache, read from sysfs: the float32 step budget follows it
(`platforms/cpu.py`)."""

from __future__ import annotations

from pathlib import Path

CPU0_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_cache_size(text: str) -> int | None:
    """Bytes of a sysfs cache `size` ("512K", "2048K", "1M"), None for anything else."""
    text = text.strip().upper()
    scale = _UNITS.get(text[-1:], 1) if text else 1
    digits = text[:-1] if text[-1:] in _UNITS else text
    return int(digits) * scale if digits.isdigit() else None


def l2_bytes_per_core(caches: Path = CPU0_CACHES) -> int | None:
    """The size of CPU 0's level-2 data (or unified) cache, None where sysfs does not say."""
    try:
        for entry in sorted(caches.glob("index*")):
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            if level == "2" and kind in ("Unified", "Data"):
                return parse_cache_size((entry / "size").read_text())
    except OSError:
        return None
    return None
