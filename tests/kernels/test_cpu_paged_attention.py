"""The C paged attention kernel (kernels/cpu_paged_attention.c) against kernels/reference.py,
on caches whose unused slots hold NaN (a read outside a context shows), and its build."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cpu_paged_attention
from pagedserve.kernels.cpu_small_gemm import cpu_has_avx512_bf16
from pagedserve.kernels.reference import paged_prefill_attention
from tests.kernels.paged_case import TOLERANCES, make_paged_case, poisoned_like


@pytest.fixture(autouse=True)
def fresh_load():
    """`load` remembers its answer; each test starts without one."""
    cpu_paged_attention.load.cache_clear()
    yield
    cpu_paged_attention.load.cache_clear()


def attend(case, query=None, **kwargs) -> torch.Tensor:
    return cpu_paged_attention.paged_attention(
        case.query if query is None else query,
        case.poisoned_k_cache,
        case.poisoned_v_cache,
        case.block_tables,
        case.seq_lens,
        case.query_start_loc,
        case.scale,
        **kwargs,
    )


def expected(case) -> torch.Tensor:
    return paged_prefill_attention(
        case.query.float(),
        case.k_cache.float(),
        case.v_cache.float(),
        case.block_tables,
        case.query_start_loc,
        case.seq_lens,
        case.scale,
    )


def test_the_kernel_builds_here():
    """CI installs a C compiler: the fast path must be there, not silently fall back."""
    assert cpu_paged_attention.load() is not None


def test_bf16_caches_use_vdpbf16ps_where_the_cpu_has_it():
    assert cpu_paged_attention.uses_bf16_dot() == cpu_has_avx512_bf16()
    assert cpu_paged_attention.uses_bf16_dot(256) == cpu_has_avx512_bf16()
    assert not cpu_paged_attention.uses_bf16_dot(40)  # not a multiple of 64
    assert not cpu_paged_attention.uses_bf16_dot(320)  # past the queries' registers


@pytest.mark.parametrize("query_lens", [[4, 4, 3, 1, 6], [1, 1, 1, 1, 1]], ids=["verify", "decode"])
def test_bf16_error_is_about_that_of_rounding_the_output(query_lens):
    """Long contexts, rows scored 16 to a zmm (verification: 9-18 rows a KV head) and by row
    (decode: 3): where the kernel rounds the softmax weights to bf16 (vdpbf16ps), its error
    stays near the bf16 rounding of the exact output itself."""
    case = make_paged_case(
        [170, 301, 64, 33, 250], query_lens, 9, 3, 64, 16, torch.bfloat16, seed=3
    )
    want = expected(case)
    error = (attend(case).float() - want).abs().max().item()
    rounding = (want.bfloat16().float() - want).abs().max().item()
    assert error <= 1.5 * rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(9, 3, 64, 8), (8, 8, 128, 16), (4, 1, 16, 4), (6, 2, 8, 1), (5, 1, 40, 4)],
    ids=["smollm2", "mha-128", "mqa", "block-1", "odd-group-head-40"],
)
def test_decode_matches_reference(dtype, num_heads, num_kv_heads, head_dim, block_size):
    # lengths of 1, at and around block boundaries, and past one 8-key tile
    seq_lens = [1, 7, 8, 9, 16, 17, 33, 170]
    case = make_paged_case(
        seq_lens, [1] * len(seq_lens), num_heads, num_kv_heads, head_dim, block_size, dtype
    )
    out = attend(case)
    assert out.dtype == dtype and out.shape == case.query.shape
    torch.testing.assert_close(out.float(), expected(case), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_short_chunks_attend_causally(dtype):
    """Several new tokens per sequence (speculative verification, short prompts): token j
    sees its cached prefix and the new tokens up to itself, no further."""
    seq_lens = [5, 12, 40, 16, 3]
    query_lens = [5, 4, 16, 1, 2]  # a whole fresh prompt, chunks over a prefix, a decode
    case = make_paged_case(seq_lens, query_lens, 9, 3, 64, 8, dtype, seed=4)
    torch.testing.assert_close(attend(case).float(), expected(case), **TOLERANCES[dtype])


def test_strided_query_is_read_in_place():
    """The model hands over q as a view into the fused qkv projection."""
    case = make_paged_case([20, 9], [1, 1], 6, 2, 16, 4, torch.float32)
    fused = torch.randn(2, 6 * 16 + 2 * 2 * 16)
    fused[:, : 6 * 16] = case.query.reshape(2, -1)
    query = fused[:, : 6 * 16].view(2, 6, 16)
    assert not query.is_contiguous()
    torch.testing.assert_close(
        attend(case, query=query), expected(case), **TOLERANCES[torch.float32]
    )


def test_only_the_listed_sequences_are_written():
    case = make_paged_case([10, 20, 30], [1, 3, 1], 6, 2, 16, 4, torch.float32)
    out = poisoned_like(case.query)
    attend(case, seqs=torch.tensor([0, 2]), out=out)
    want = expected(case)
    for rows in ([0], [4]):  # sequences 0 and 2
        torch.testing.assert_close(out[rows], want[rows], **TOLERANCES[torch.float32])
    assert out[1:4].isnan().all()  # sequence 1's three rows were left alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_claimed_sequence_is_attended_once(dtype):
    """Threads claim whole sequences one ahead of the one they attend (to fetch it meanwhile):
    every row is written, and right, with more sequences than threads, contexts longer than
    the lookahead holds (1500 tokens: 1.1 MB of bf16 keys and values) beside short ones."""
    seq_lens = [1500, 3, 170, 1, 700, 64, 9, 1200, 33, 250, 17]
    query_lens = [1, 1, 4, 1, 1, 2, 1, 1, 1, 3, 1]
    case = make_paged_case(seq_lens, query_lens, 9, 3, 64, 16, dtype, seed=5)
    out = poisoned_like(case.query)
    attend(case, out=out)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), expected(case), **TOLERANCES[dtype])


@pytest.fixture
def two_threads():
    """Two OpenMP threads (the kernel's team is torch's), whatever the machine's default."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(9, 3, 64, 16), (5, 1, 40, 4), (8, 8, 16, 8)],
    ids=["smollm2", "odd-group-head-40", "mha-16"],
)
def test_a_decode_gets_the_same_bits_alone_or_among_others(
    dtype, num_heads, num_kv_heads, head_dim, block_size, two_threads
):
    """Among other sequences a thread takes a float32 decode's (or verification's) whole
    sequence, every KV head in one pass over its keys and one over its values (the next
    sequence's first keys fetched at its end); alone, one sequence for two threads, its KV
    heads go to the threads pair by pair, one pass each (bf16: pairs both ways off the dot
    path). Chunks of more new tokens sit between them (12 by pair, 20 on float32's lanes), so
    a thread passes from one way to the other. The sums run in the same order either way: the
    same bits, and right."""
    seq_lens, query_lens = [300, 17, 50, 170, 1, 64, 90, 9, 33], [1, 1, 12, 4, 1, 2, 20, 1, 3]
    case = make_paged_case(
        seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=7
    )
    together = attend(case, out=poisoned_like(case.query))
    assert not together.isnan().any()
    starts = case.query_start_loc.tolist()
    for s in range(len(seq_lens)):
        alone = attend(case, seqs=torch.tensor([s]), out=poisoned_like(case.query))
        rows = slice(starts[s], starts[s + 1])
        assert torch.equal(alone[rows], together[rows]), f"sequence {s}"
    torch.testing.assert_close(together.float(), expected(case), **TOLERANCES[dtype])


@pytest.fixture
def single_decodes_restored():
    """The kernel's order for float32 single-token decodes set back to its default (by
    sequence) after the test; the order changes no result, only the speed."""
    yield
    assert cpu_paged_attention.set_single_decodes_by_sequence(True) is True


@pytest.mark.parametrize("num_seqs", [2, 40])
def test_single_decodes_get_the_same_bits_by_sequence_or_by_pair(
    num_seqs, two_threads, single_decodes_restored
):
    """The worker picks, for the process, whether a float32 decode of one new token goes by
    sequence or by (sequence, KV head) pair (platforms/cpu.py, from the core's L2). Either way
    the same bits, beside verifications (by sequence both ways) and a chunk on lanes, and
    right."""
    seq_lens = [300 - 7 * i for i in range(num_seqs)] + [90, 40]
    query_lens = [1 if i % 5 else 4 for i in range(num_seqs)] + [20, 1]
    case = make_paged_case(seq_lens, query_lens, 9, 3, 64, 16, torch.float32, seed=11)
    assert cpu_paged_attention.set_single_decodes_by_sequence(False) is False
    by_pair = attend(case, out=poisoned_like(case.query))
    assert cpu_paged_attention.set_single_decodes_by_sequence(True) is True
    by_sequence = attend(case, out=poisoned_like(case.query))
    assert not by_pair.isnan().any()
    assert torch.equal(by_pair, by_sequence)
    torch.testing.assert_close(by_pair, expected(case), **TOLERANCES[torch.float32])


def test_the_order_is_not_set_where_the_kernel_is_off(monkeypatch):
    """With the kernel switched off (or not built) there is nothing to set: None, no error, so
    a worker without the kernel starts as before."""
    monkeypatch.setenv("PAGEDSERVE_CPU_ATTENTION_KERNEL", "0")
    assert cpu_paged_attention.set_single_decodes_by_sequence(False) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_split_between_threads_gives_the_same_bits(dtype):
    """A chunk whose work is more than a thread's share is attended in units of rows (on
    lanes: bf16's dot path, float32's); beside long decodes it is a small share and stays
    whole. Its rows come out the same either way, and right."""
    seq_lens, query_lens = [40] + [1600] * 8, [40] + [1] * 8
    case = make_paged_case(seq_lens, query_lens, 9, 3, 64, 16, dtype, seed=6)
    beside_decodes = attend(case)
    alone = poisoned_like(case.query)
    attend(case, seqs=torch.tensor([0]), out=alone)
    assert torch.equal(alone[:40], beside_decodes[:40])
    assert alone[40:].isnan().all()  # the decodes' rows were left alone
    torch.testing.assert_close(beside_decodes.float(), expected(case), **TOLERANCES[dtype])


@pytest.mark.parametrize("head_dim", [64, 40, 128])
def test_float32_prompt_chunks_on_lanes_attend_causally(head_dim):
    """Float32 chunks of more than 16 new tokens go through the float32 lanes: 16 rows a
    block, weighed 6 rows at a time (every remainder of both below), 16 dimensions a pass
    (head_dim 40: an odd multiple of 8 ends on 8), after a cached prefix or from the start;
    beside them a 16-token chunk and decodes by row. Every row right, none outside written."""
    seq_lens, query_lens = [17, 200, 83, 16, 300, 5], [17, 60, 83, 16, 1, 1]
    case = make_paged_case(seq_lens, query_lens, 8, 2, head_dim, 16, torch.float32, seed=9)
    out = poisoned_like(case.query)
    attend(case, out=out)
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected(case), **TOLERANCES[torch.float32])
    grouped = make_paged_case([90], [90], 6, 1, head_dim, 8, torch.float32, seed=3)  # 540 rows
    torch.testing.assert_close(attend(grouped), expected(grouped), **TOLERANCES[torch.float32])


def test_a_float32_row_on_lanes_does_not_depend_on_its_neighbours():
    """A row's sums run in the same order whatever rows share its block: the last token of a
    chunk gets the same bits attended as the chunk's last 17 tokens or as its whole 100."""
    case = make_paged_case([100], [100], 9, 3, 64, 16, torch.float32, seed=4)
    whole = attend(case)
    tail = make_paged_case([100], [17], 9, 3, 64, 16, torch.float32, seed=4)
    assert torch.equal(tail.k_cache, case.k_cache)  # the same context, fewer new tokens
    last = case.query[-17:].clone()
    got = cpu_paged_attention.paged_attention(
        last, tail.poisoned_k_cache, tail.poisoned_v_cache, tail.block_tables, tail.seq_lens,
        tail.query_start_loc, tail.scale,
    )  # fmt: skip
    assert torch.equal(got, whole[-17:])


def test_an_out_of_the_wrong_shape_is_refused():
    case = make_paged_case([10], [1], 6, 2, 16, 4, torch.float32)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        attend(case, out=torch.empty(2, 6, 16))


def test_a_cache_of_another_dtype_is_refused():
    case = make_paged_case([10], [1], 6, 2, 16, 4, torch.float32)
    with pytest.raises(ValueError, match="k_cache must be contiguous and of the query's dtype"):
        cpu_paged_attention.paged_attention(
            case.query,
            case.k_cache.bfloat16(),
            case.v_cache,
            case.block_tables,
            case.seq_lens,
            case.query_start_loc,
            case.scale,
        )


def test_supports_only_what_it_computes():
    query = torch.zeros(1, 4, 16)
    cache = torch.zeros(2, 4, 2, 16)
    assert cpu_paged_attention.supports(query, cache)
    assert not cpu_paged_attention.supports(query.half(), cache.half())  # fp16
    assert not cpu_paged_attention.supports(query.bfloat16(), cache)  # mixed dtypes
    assert not cpu_paged_attention.supports(torch.zeros(1, 4, 12), torch.zeros(2, 4, 2, 12))


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("PAGEDSERVE_CPU_ATTENTION_KERNEL", "0")
    assert cpu_paged_attention.load() is None
    assert not cpu_paged_attention.supports(torch.zeros(1, 4, 16), torch.zeros(2, 4, 2, 16))


def test_a_build_is_reused(tmp_path):
    first = cpu_paged_attention.build(tmp_path)
    built_at = first.stat().st_mtime_ns
    assert cpu_paged_attention.build(tmp_path) == first
    assert first.stat().st_mtime_ns == built_at
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no partial file left


def test_a_failing_compiler_falls_back_with_a_reason(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CC", "/bin/false")
    monkeypatch.setenv("PAGEDSERVE_CACHE", str(tmp_path))
    with pytest.raises(cpu_paged_attention.KernelBuildError, match="does not run"):
        cpu_paged_attention.build(tmp_path)
    assert cpu_paged_attention.load() is None
    assert "CPU paged attention kernel unavailable" in caplog.text
    assert not list(tmp_path.rglob("*.so"))


def test_the_isa_follows_torchs_capability(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine must give AVX2 code here too."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    flags = cpu_paged_attention.compile_flags()
    assert "-mavx2" in flags and not any(f.startswith("-mavx512") for f in flags)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert not any(f.startswith("-mavx") for f in cpu_paged_attention.compile_flags())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_avx2_build_builds_and_attends(dtype, monkeypatch):
    """The code an AVX2 CPU gets (no vdpbf16ps path: the bf16 dot header left out) builds from
    the same source, and attends decodes beside a long prompt right."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not cpu_paged_attention.uses_bf16_dot()
    assert cpu_paged_attention.load() is not None
    seq_lens, query_lens = [120, 30, 7, 64], [120, 1, 1, 4]
    case = make_paged_case(seq_lens, query_lens, 9, 3, 64, 16, dtype, seed=7)
    torch.testing.assert_close(attend(case).float(), expected(case), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whole_prompts_attend_causally(dtype):
    """A prompt of any length goes through the kernel on lanes (float32's; bf16's where it uses
    vdpbf16ps): row blocks early in a prompt read only the keys they see; one or two sequences
    are split between threads in units of rows."""
    for seq_lens, query_lens in (([300], [300]), ([300, 57], [300, 25])):
        case = make_paged_case(seq_lens, query_lens, 9, 3, 64, 16, dtype, seed=5)
        want = expected(case)
        got = attend(case).float()
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, **TOLERANCES[dtype])
        else:
            rounding = (want.bfloat16().float() - want).abs().max().item()
            assert (got - want).abs().max().item() <= 1.5 * rounding


def test_the_longest_chunk_the_kernel_takes():
    assert cpu_paged_attention.max_query_len(torch.float32, 64) is None  # float32 lanes
    assert cpu_paged_attention.max_query_len(torch.float32, 36) == 16  # not a multiple of 8
    assert cpu_paged_attention.max_query_len(torch.float32, 264) == 16  # past the lanes' queries
    assert cpu_paged_attention.max_query_len(torch.bfloat16, 64) == (
        None if cpu_has_avx512_bf16() else 16
    )
    assert cpu_paged_attention.max_query_len(torch.bfloat16, 40) == 16  # not a dot head
