"""Rank 0's grammar state: masks that allow exactly what the grammar allows, matchers that
catch up over a sequence's outputs (as after a preemption), rows deferred while a grammar
compiles, and compile errors reported per row."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from pagedserve.services.gpu_worker.grammar_book import GrammarBook
from pagedserve.services.gpu_worker.grammar_compiler import GrammarCompileError, GrammarCompiler
from pagedserve.services.gpu_worker.sampler import AllowedTokens, apply_allowed_tokens
from pagedserve.shared.protocol import SamplingParams, StructuredOutput
from tests.integration.pipeline.served_model import build_served_model

CHOICE = StructuredOutput("grammar", 'root ::= "yes" | "no"')
LARK_CHOICE = StructuredOutput("lark", 'start: YES | "no"\nYES: "yes"')


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_served_model(tmp_path_factory.mktemp("grammar-model"))


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture
def book(model_dir: Path, tokenizer) -> GrammarBook:
    return GrammarBook(GrammarCompiler(model_dir, len(tokenizer)))


def allowed_ids(bitmask_row: torch.Tensor, vocab: int) -> set[int]:
    logits = torch.zeros(1, vocab)
    masked = apply_allowed_tokens(logits, AllowedTokens([0], bitmask_row.unsqueeze(0)))
    return set(torch.isfinite(masked[0]).nonzero().squeeze(1).tolist())


def params(spec: StructuredOutput, eos: int) -> SamplingParams:
    return SamplingParams(structured_output=spec, eos_token_ids=(eos,))


@pytest.mark.parametrize("spec", [CHOICE, LARK_CHOICE])
def test_masks_follow_the_grammar_and_end_on_eos(book, tokenizer, spec):
    eos, vocab = tokenizer.eos_token_id, len(tokenizer)
    book.track("a", params(spec, eos))
    book.compiler.compile(spec).result()
    masks = book.start_masks([("a", [])]).result()
    first = allowed_ids(masks.bitmask[0], vocab)
    texts = {tokenizer.decode([t]) for t in first}
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts)
    yes = tokenizer.encode("yes", add_special_tokens=False)
    masks = book.start_masks([("a", yes)]).result()  # the whole choice: only EOS is left
    assert allowed_ids(masks.bitmask[0], vocab) == {eos}


def test_a_resent_sequence_catches_up_over_its_outputs(book, tokenizer):
    eos, vocab = tokenizer.eos_token_id, len(tokenizer)
    no = tokenizer.encode("no", add_special_tokens=False)
    book.track("a", params(CHOICE, eos))
    book.compiler.compile(CHOICE).result()
    book.drop(["a"])  # preempted
    book.track("a", params(CHOICE, eos))  # re-sent in full with its outputs
    masks = book.start_masks([("free", []), ("a", no)]).result()
    assert masks.row_ids == [1]  # the unconstrained row is not masked
    assert allowed_ids(masks.bitmask[0], vocab) == {eos}


def test_rows_wait_for_their_grammar_and_compile_errors_are_reported(book, tokenizer):
    pending: Future = Future()
    book.compiler._futures[StructuredOutput("regex", "slow")] = pending
    book.track("slow", params(StructuredOutput("regex", "slow"), tokenizer.eos_token_id))
    book.track("bad", params(StructuredOutput("regex", "a(("), tokenizer.eos_token_id))
    with pytest.raises(GrammarCompileError):
        book.compiler.compile(StructuredOutput("regex", "a((")).result()
    masks = book.start_masks([("slow", []), ("bad", [])]).result()
    assert masks.deferred_rows == [0] and masks.bitmask is None
    assert "regex" in masks.row_errors[1]
    pending.set_result(book.compiler.compile(CHOICE).result())
    masks = book.start_masks([("slow", [])]).result()
    assert masks.row_ids == [0] and not masks.deferred_rows


def test_each_distinct_spec_compiles_once(book, tokenizer):
    for i in range(5):
        book.track(f"s{i}", params(CHOICE, tokenizer.eos_token_id))
    book.compiler.compile(CHOICE).result()
    assert book.compiler.num_compiled == 1


def test_a_tool_call_structural_tag_compiles_with_its_schemas_fixed(book):
    import json

    from pagedserve.services.gpu_worker.json_schema_fixups import fix_structural_tag

    bounded = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 5}}}
    tag = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<tool_call>"],
        "tags": [{"type": "tag", "begin": '<tool_call>\n{"name": "f", "arguments": ',
                  "content": {"type": "json_schema", "json_schema": bounded},
                  "end": "}\n</tool_call>"}],
    }}  # fmt: skip
    fixed = json.loads(fix_structural_tag(json.dumps(tag)))
    city = fixed["format"]["tags"][0]["content"]["json_schema"]["properties"]["city"]
    assert "pattern" in city  # the bounded string rewritten, as for a response_format schema
    spec = StructuredOutput("structural_tag", json.dumps(tag))
    assert book.compiler.compile(spec).result() is not None
