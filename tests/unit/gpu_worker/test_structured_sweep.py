"""The correctness sweep: 200 JSON outputs over the 20 schemas of `structured_cases`, plus
regexes and choices, sampled at temperature 1 from the default model (SmolLM2-135M) in the
in-process engine (the HTTP path adds nothing to what is checked here; the openai-client tests
cover it). Every output must finish with "stop" and parse and validate.

The KV cache is kept small so that sequences are preempted and recomputed mid-output, and the
prompts share a prefix, so prefix caching serves part of every prompt: the grammar state must
survive both."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from benchmarks.structured_cases import (
    CHOICES,
    JSON_SCHEMAS,
    MAX_TOKENS_PER_SCHEMA,
    REGEXES,
)
from pagedserve.services.engine import LLMEngine
from pagedserve.shared.config import CacheConfig, SchedulerConfig
from pagedserve.shared.protocol import SamplingParams, StructuredOutput

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

OUTPUTS_PER_SCHEMA = 10
OUTPUTS_PER_PATTERN = 8


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(
        "smollm2",
        SchedulerConfig(max_model_len=512, max_num_seqs=128),
        CacheConfig(num_blocks=300),  # far less than the batch needs: forces preemptions
    )


def chat_prompt(engine: LLMEngine, request: str) -> str:
    messages = [
        {"role": "system", "content": "You answer with compact JSON or the exact format asked."},
        {"role": "user", "content": request},
    ]
    return engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def constrained(kind: str, spec: str, seed: int) -> SamplingParams:
    return SamplingParams(
        temperature=1.0,
        seed=seed,
        max_tokens=MAX_TOKENS_PER_SCHEMA,
        structured_output=StructuredOutput(kind, spec),
    )


def test_every_sampled_output_parses_and_validates(engine):
    prompts: list[str] = []
    params: list[SamplingParams] = []
    checks: list[tuple[str, object]] = []
    for index, schema in enumerate(JSON_SCHEMAS):
        spec = json.dumps(schema, sort_keys=True)
        for i in range(OUTPUTS_PER_SCHEMA):
            prompts.append(chat_prompt(engine, f"Fill this JSON schema: {spec}"))
            params.append(constrained("json", spec, seed=1000 * index + i))
            checks.append(("json", schema))
    for index, pattern in enumerate(REGEXES):
        for i in range(OUTPUTS_PER_PATTERN):
            prompts.append(chat_prompt(engine, f"Write text matching {pattern}"))
            params.append(constrained("regex", pattern, seed=7000 + 100 * index + i))
            checks.append(("regex", pattern))
    for index, choices in enumerate(CHOICES):
        grammar = "root ::= " + " | ".join(json.dumps(c) for c in choices)
        for i in range(OUTPUTS_PER_PATTERN):
            prompts.append(chat_prompt(engine, f"Pick one of {choices}"))
            params.append(constrained("grammar", grammar, seed=9000 + 100 * index + i))
            checks.append(("choice", choices))

    results = engine.generate(prompts, params)

    assert sum(kind == "json" for kind, _ in checks) == 200
    failures = []
    for result, (kind, expected) in zip(results, checks, strict=True):
        try:
            assert result.finish_reason == "stop", f"finished with {result.finish_reason}"
            if kind == "json":
                jsonschema.validate(json.loads(result.text), expected)
            elif kind == "regex":
                assert re.fullmatch(expected, result.text), "no match"
            else:
                assert result.text in expected, "not a choice"
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{kind} {result.text!r}: {exc}")
    assert not failures, f"{len(failures)}/{len(results)} invalid:\n" + "\n".join(failures[:10])
    assert engine.scheduler.stats().num_preemptions > 0  # the recompute path was exercised
    assert engine.runner.grammars.compiler.num_compiled == len(JSON_SCHEMAS) + len(REGEXES) + len(
        CHOICES
    )  # once per distinct spec
    engine.scheduler.check_integrity()
