"""The compiled-grammar cache stays bounded however many distinct specs requests bring: in
count and in bytes, least recently asked for first, and xgrammar's own (unbounded) cache
unused."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.services.gpu_worker import grammar_compiler
from pagedserve.services.gpu_worker.grammar_compiler import GrammarCompiler
from pagedserve.shared.protocol import StructuredOutput
from tests.integration.pipeline.served_model import build_served_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_served_model(tmp_path_factory.mktemp("grammar-cache-model"))


def regex(i: int) -> StructuredOutput:
    return StructuredOutput("regex", f"item{i}-[a-z]{{1,{i + 1}}}")


def compiler_for(model_dir: Path) -> GrammarCompiler:
    from transformers import AutoTokenizer

    return GrammarCompiler(model_dir, len(AutoTokenizer.from_pretrained(model_dir)))


def test_the_cache_keeps_at_most_max_grammars_the_latest_asked_for(model_dir, monkeypatch):
    monkeypatch.setattr(grammar_compiler, "MAX_CACHED_GRAMMARS", 3)
    compiler = compiler_for(model_dir)
    try:
        for i in range(5):
            compiler.compile(regex(i)).result()
        compiler.compile(regex(2)).result()  # asked for again: the most recent
        compiler.compile(regex(5)).result()
        assert list(compiler._futures) == [regex(4), regex(2), regex(5)]
        assert compiler._compiler.get_cache_size_bytes() == 0  # xgrammar keeps none of its own
    finally:
        compiler.shutdown()


def test_the_cache_keeps_at_most_max_bytes_of_grammars(model_dir, monkeypatch):
    compiler = compiler_for(model_dir)
    try:
        one = compiler.compile(regex(0)).result().memory_size_bytes
        assert one > 0
        monkeypatch.setattr(grammar_compiler, "MAX_CACHED_GRAMMAR_BYTES", int(2.5 * one))
        for i in range(1, 8):
            newest = compiler.compile(regex(i)).result().memory_size_bytes
            # eviction runs as a spec is asked for, before it is compiled: past the bound
            # by at most that newest grammar
            assert compiler.cached_bytes() - newest <= 2.5 * one
        assert regex(7) in compiler._futures and regex(0) not in compiler._futures
        assert 1 <= len(compiler._futures) <= 3
        assert compiler.num_compiled == 8
    finally:
        compiler.shutdown()
