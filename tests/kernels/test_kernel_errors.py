"""Bad arguments to the kernel wrappers fail on the host with a message naming the bound."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from pagedserve.kernels import paged_decode_attention, paged_prefill_attention
from tests.kernels.paged_case import make_paged_case


def decode_args(**overrides: object) -> dict[str, object]:
    case = make_paged_case([5, 17], [1, 1], 4, 2, 64, 16, torch.float32)
    args: dict[str, object] = {
        "query": case.query,
        "k_cache": case.k_cache,
        "v_cache": case.v_cache,
        "block_tables": case.block_tables,
        "seq_lens": case.seq_lens,
        "scale": case.scale,
    }
    args.update(overrides)
    return args


def test_query_heads_must_be_a_multiple_of_kv_heads() -> None:
    args = decode_args(query=torch.randn(2, 5, 64))
    with pytest.raises(ValueError, match="num_heads 5 must be a multiple of num_kv_heads 2"):
        paged_decode_attention(**args)


def test_query_and_cache_dtypes_must_match() -> None:
    args = decode_args(query=torch.randn(2, 4, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"query dtype torch\.float16 must match"):
        paged_decode_attention(**args)


def test_block_size_below_the_dot_minimum_is_rejected() -> None:
    cache = torch.zeros(4, 8, 2, 64)
    with pytest.raises(ValueError, match="block_size must be a power of two >= 16, got 8"):
        paged_decode_attention(**decode_args(k_cache=cache, v_cache=cache))


def test_block_tables_must_be_int32() -> None:
    args = decode_args()
    args["block_tables"] = args["block_tables"].long()  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="block_tables dtype must be one of"):
        paged_decode_attention(**args)


def test_batch_sizes_must_agree() -> None:
    args = decode_args()
    args["seq_lens"] = args["seq_lens"][:1]  # type: ignore[index]
    with pytest.raises(ValueError, match="must equal the number of sequences 2"):
        paged_decode_attention(**args)


def test_num_splits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_splits must be >= 1, got 0"):
        paged_decode_attention(**decode_args(), num_splits=0)


def test_out_must_match_the_query() -> None:
    with pytest.raises(ValueError, match=r"out must be \(2, 4, 64\)"):
        paged_decode_attention(**decode_args(), out=torch.empty(2, 4, 32))


def test_query_start_loc_must_have_one_more_entry_than_sequences() -> None:
    case = make_paged_case([5, 17], [5, 1], 4, 2, 64, 16, torch.float32)
    with pytest.raises(ValueError, match="must be num_seqs \\+ 1"):
        paged_prefill_attention(
            case.query,
            case.k_cache,
            case.v_cache,
            case.block_tables,
            case.query_start_loc[:2],
            case.seq_lens,
            case.scale,
        )


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(RuntimeError, match="need TRITON_INTERPRET=1"):
        paged_decode_attention(**decode_args())


def test_reference_and_api_import_without_triton() -> None:
    # A CPU-only install may lack Triton: the reference path and the API module must load.
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import kernels, kernels.reference\n"
        "assert callable(kernels.paged_decode_attention)\n"
        "assert 'pagedserve.kernels.paged_decode' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
