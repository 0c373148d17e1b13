"""Huge pages for the CPU worker's packed weights and KV cache (`cpu_huge_pages.py`): what is
advised, that Linux then backs it with huge pages (read back from /proc/self/smaps), the arena
the packed weights share, and the switch that turns it off."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from pagedserve.services.gpu_worker import cpu_huge_pages
from pagedserve.services.gpu_worker.cpu_huge_pages import SWITCH, PanelArena
from pagedserve.services.gpu_worker.kv_cache import KVCacheLayout
from pagedserve.services.gpu_worker.layers.linear_method import PLAIN_LINEAR
from pagedserve.services.gpu_worker.platforms import cpu_prepack

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MIB = 1 << 20


def thp_mode() -> str | None:
    """The kernel's THP mode ("always", "madvise", "never"), None without THP."""
    try:
        return re.search(r"\[(\w+)\]", THP_MODE.read_text()).group(1)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return None


requires_thp = pytest.mark.skipif(
    thp_mode() in (None, "never"), reason="this kernel gives no transparent huge pages"
)


def huge_bytes_at(address: int) -> int:
    """AnonHugePages of the mapping of /proc/self/smaps that holds `address`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            inside = int(head.group(1), 16) <= address < int(head.group(2), 16)
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def test_a_buffer_of_a_huge_page_or_more_starts_on_a_huge_page():
    page = cpu_huge_pages.huge_page_bytes()
    tensor = cpu_huge_pages.empty((3, page // 4), torch.float32)
    assert tensor.shape == (3, page // 4) and tensor.is_contiguous()
    if thp_mode() is not None:
        assert tensor.data_ptr() % page == 0
    tensor.fill_(2.0)  # all of it is writable memory
    assert tensor.sum().item() == 2.0 * tensor.numel()


def test_a_buffer_below_a_huge_page_is_plain_torch_memory():
    small = cpu_huge_pages.empty((1000,), torch.float32)
    assert small.untyped_storage().nbytes() == 4000 and small.is_contiguous()


@requires_thp
def test_zeros_are_zero_and_in_huge_pages():
    tensor = cpu_huge_pages.zeros((16 * MIB // 4,), torch.float32)
    assert not tensor.any()
    assert huge_bytes_at(tensor.data_ptr() + 8 * MIB) >= 8 * MIB


@requires_thp
def test_switched_off_the_memory_stays_in_small_pages(monkeypatch):
    if thp_mode() == "always":
        pytest.skip("THP 'always': every large mapping gets huge pages, advised or not")
    monkeypatch.setenv(SWITCH, "0")
    tensor = cpu_huge_pages.zeros((16 * MIB // 4,), torch.float32)
    assert huge_bytes_at(tensor.data_ptr() + 8 * MIB) == 0


@requires_thp
def test_a_cpu_kv_cache_is_zeroed_in_huge_pages():
    layout = KVCacheLayout(2, 16, 4, 64, torch.bfloat16)
    caches = layout.allocate(1024, torch.device("cpu"))  # 8 MiB a tensor
    for key, value in caches:
        assert key.data_ptr() != value.data_ptr() and not key.any() and not value.any()
        assert huge_bytes_at(key.data_ptr() + key.numel()) > 0


def test_arena_slices_are_aligned_typed_and_in_order():
    arena = PanelArena([3 * 2, 100 * 4, 64])
    a = arena.take(3, torch.bfloat16)
    b = arena.take(100, torch.float32)
    c = arena.take(64, torch.uint8)
    assert (a.dtype, a.numel(), b.dtype, b.numel(), c.numel()) == (
        torch.bfloat16, 3, torch.float32, 100, 64,
    )  # fmt: skip
    assert all(t.data_ptr() % cpu_huge_pages.ALIGNMENT == 0 for t in (a, b, c))
    assert a.data_ptr() < b.data_ptr() < c.data_ptr()
    for tensor, value in ((a, 2.0), (b, 1.5), (c, 7)):
        tensor.fill_(value)
    # no slice runs into the next: each kept its own value
    assert a.float().eq(2.0).all() and b.eq(1.5).all() and c.eq(7).all()


def test_a_slice_past_the_arena_is_an_error_that_says_so():
    arena = PanelArena([64])
    arena.take(16, torch.float32)
    with pytest.raises(ValueError, match="64 bytes hold no further 4-byte slice"):
        arena.take(1, torch.float32)


def _kernel_dtype() -> torch.dtype | None:
    """A dtype whose weights get the kernel's panels here (bf16 first), or None."""
    if cpu_prepack.cpu_small_gemm.load() is not None:
        return torch.bfloat16
    return torch.float32 if cpu_prepack.fp32_uses_kernel() else None


def _panels_of(module: torch.nn.Module) -> torch.Tensor:
    packing = cpu_prepack.packing_of(module)
    return packing.few_rows if module.weight.dtype == torch.bfloat16 else packing.kernel


def test_a_models_packed_weights_share_one_arena_in_module_order():
    dtype = _kernel_dtype()
    if dtype is None:
        pytest.skip("no panel kernel here (MKL or oneDNN hold the weights)")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(_Linear(96, 64, dtype) for _ in range(3)))
    assert cpu_prepack.prepack_linears(model) == 3
    panels = [_panels_of(m) for m in model]
    assert len({p.untyped_storage().data_ptr() for p in panels}) == 1  # one buffer
    assert panels[0].data_ptr() < panels[1].data_ptr() < panels[2].data_ptr()
    kernel = cpu_prepack.cpu_small_gemm if dtype == torch.bfloat16 else cpu_prepack.cpu_small_sgemm
    for module, packed in zip(model, panels, strict=True):
        assert torch.equal(packed, kernel.pack(module.weight))  # as packed alone


def test_packing_into_a_slice_of_the_wrong_size_is_an_error():
    dtype = _kernel_dtype()
    if dtype is None:
        pytest.skip("no panel kernel here")
    kernel = cpu_prepack.cpu_small_gemm if dtype == torch.bfloat16 else cpu_prepack.cpu_small_sgemm
    weight = torch.randn(96, 64).to(dtype)
    with pytest.raises(ValueError, match="contiguous"):
        kernel.pack(weight, torch.empty(kernel.packed_numel(96, 64) - 1, dtype=dtype))
    with pytest.raises(ValueError, match="contiguous"):
        kernel.pack(weight, torch.empty(kernel.packed_numel(96, 64), dtype=torch.float16))


class _Linear(torch.nn.Module):
    def __init__(self, num_out: int, num_in: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(num_out, num_in).to(dtype))
        self.linear_method = PLAIN_LINEAR
