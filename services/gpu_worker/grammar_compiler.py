"""Compiles structured-output specs into xgrammar grammars, once per distinct spec, off the step
loop.

`compile(spec)` returns at once with a future; the first request for a spec starts its
compilation on a background thread, later ones share the same future (and so the same compiled
grammar: its token-mask cache is what makes masks cheap). The step loop only ever asks
`future.done()`, so a slow grammar delays the requests that need it and nothing else.

xgrammar (and the tokenizer it is built from) is imported and loaded on the compile thread at
the first structured request: a worker that never sees one pays nothing.

The futures are the only cache: an LRU of at most MAX_CACHED_GRAMMARS grammars and
MAX_CACHED_GRAMMAR_BYTES of them (xgrammar's `memory_size_bytes`; evicted as a new spec is
asked for, before it compiles, so past the bound by at most that newest grammar), so that a
server whose requests each bring a schema of their own keeps a bounded memory. xgrammar's own
compiler cache is off: unbounded by default, it held every grammar ever compiled (~75 KB a
small JSON schema with SmolLM2's vocabulary: the worker grew by 175 MiB over 1500 distinct
schemas). A grammar evicted while requests still use it lives on in their matchers until they
finish."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pagedserve.services.gpu_worker.json_schema_fixups import fix_json_schema, fix_structural_tag
from pagedserve.shared.protocol import StructuredOutput

logger = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 512
MAX_CACHED_GRAMMAR_BYTES = 256 * 2**20
ANY_JSON_OBJECT = json.dumps({"type": "object"})


class GrammarCompileError(ValueError):
    """A spec the grammar library refused; the message says why."""


class GrammarCompiler:
    """Compiled grammars of one model's vocabulary, by spec (an LRU bounded in count and
    bytes)."""

    def __init__(
        self, model_dir: Path, vocab_size: int, stop_token_ids: tuple[int, ...] = ()
    ) -> None:
        self.model_dir = model_dir
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._compiler: Any = None  # xgrammar.GrammarCompiler, built on the compile thread
        self._futures: OrderedDict[StructuredOutput, Future[Any]] = OrderedDict()
        self.num_compiled = 0

    def compile(self, spec: StructuredOutput) -> Future[Any]:
        """The future compiled grammar of `spec` (an xgrammar CompiledGrammar); its exception
        is a GrammarCompileError when the library refuses the spec."""
        future = self._futures.get(spec)
        if future is not None:
            self._futures.move_to_end(spec)
            return future
        future = self._executor.submit(self._compile_now, spec)
        self._futures[spec] = future
        self._evict()
        return future

    def cached_bytes(self) -> int:
        """The memory of the compiled grammars the cache holds (those still compiling: 0)."""
        return sum(_grammar_bytes(f) for f in self._futures.values())

    def _evict(self) -> None:
        """Drop the least recently asked for grammars past either bound (never the newest)."""
        while len(self._futures) > MAX_CACHED_GRAMMARS:
            self._futures.popitem(last=False)
        total = self.cached_bytes()
        while total > MAX_CACHED_GRAMMAR_BYTES and len(self._futures) > 1:
            _, oldest = self._futures.popitem(last=False)
            total -= _grammar_bytes(oldest)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _compile_now(self, spec: StructuredOutput) -> Any:
        try:
            compiler = self._library_compiler()
        except (OSError, ValueError) as exc:
            raise GrammarCompileError(
                f"structured outputs need the model's tokenizer, which did not load: {exc}"
            ) from exc
        try:
            if spec.kind == "json":
                compiled = compiler.compile_json_schema(
                    fix_json_schema(spec.spec), any_whitespace=False
                )
            elif spec.kind == "json_object":
                compiled = compiler.compile_json_schema(
                    ANY_JSON_OBJECT, any_whitespace=False, strict_mode=False
                )
            elif spec.kind == "regex":
                compiled = compiler.compile_regex(spec.spec)
            elif spec.kind == "grammar":
                compiled = compiler.compile_grammar(spec.spec)
            elif spec.kind == "lark":
                compiled = compiler.compile_lark(spec.spec)
            elif spec.kind == "structural_tag":
                compiled = compiler.compile_structural_tag(fix_structural_tag(spec.spec))
            else:
                raise GrammarCompileError(f"unknown structured output kind {spec.kind!r}")
        except GrammarCompileError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError with its reason
            raise GrammarCompileError(f"invalid {spec.kind}: {exc}") from exc
        self.num_compiled += 1
        return compiled

    def _library_compiler(self) -> Any:
        if self._compiler is None:
            import xgrammar
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
            info = xgrammar.TokenizerInfo.from_huggingface(
                tokenizer,
                vocab_size=self.vocab_size,
                stop_token_ids=list(self.stop_token_ids) or None,
            )
            # the futures are the cache (bounded); xgrammar's own would keep every grammar
            self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            logger.info("grammar compiler ready for %s", self.model_dir)
        return self._compiler


def _grammar_bytes(future: Future[Any]) -> int:
    if not future.done() or future.cancelled() or future.exception() is not None:
        return 0
    return int(future.result().memory_size_bytes)
