"""What tool_choice "auto" costs a sequence per step: the bitmask fill of its structural tag
(free text until `<tool_call>`, then a function's schema) while the model writes text and
inside a call, next to a plain JSON schema's, on the default model's vocabulary; and the
tag's compile time (once per distinct tool list).

    python -m benchmarks.auto_tool_masks [--fills 400] \
        [--out benchmarks/results/auto_tool_masks.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.structured_cases import MID_SIZE_SCHEMA
from pagedserve.services.gateway.openai_schema import parse_chat_request
from pagedserve.services.gpu_worker.default_model import ensure_model

TOOL = {"type": "function", "function": {"name": "submit", "parameters": MID_SIZE_SCHEMA}}
FREE_TEXT = "The weather in Paris is"
IN_CALL = '<tool_call>\n{"name": "submit", "arguments": {'


def fill_ms(xgr: Any, compiled: Any, prefix: str, fills: int) -> float:
    """Mean milliseconds of one bitmask fill after the matcher has read `prefix`."""
    matcher = xgr.GrammarMatcher(compiled)
    assert matcher.accept_string(prefix), prefix
    mask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    start = time.perf_counter()
    for _ in range(fills):
        matcher.fill_next_token_bitmask(mask)
    return (time.perf_counter() - start) / fills * 1e3


def measure(fills: int) -> dict[str, float]:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_model("smollm2"))
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}
    spec = parse_chat_request(body).sampling.structured.output.spec
    start = time.perf_counter()
    tag = compiler.compile_structural_tag(spec)
    compile_ms = (time.perf_counter() - start) * 1e3
    schema = compiler.compile_json_schema(json.dumps(MID_SIZE_SCHEMA), any_whitespace=False)
    return {
        "tag_compile_ms": compile_ms,
        "fill_ms_free_text": fill_ms(xgr, tag, FREE_TEXT, fills),
        "fill_ms_inside_call": fill_ms(xgr, tag, IN_CALL, fills),
        "fill_ms_json_schema": fill_ms(xgr, schema, "{", fills),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fills", type=int, default=400)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = measure(args.fills)
    for name, value in result.items():
        print(f"{name:22s} {value:8.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
