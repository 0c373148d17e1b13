"""vllm:tool_call_parser_invocations: the Hermes parser's runs, once per non-streamed choice
and once per streamed delta, by whether it found a call (vLLM's counting)."""

from __future__ import annotations

import re
from types import SimpleNamespace

from pagedserve.services.gateway.metrics import GatewayMetrics
from pagedserve.services.gateway.output_modes import HermesToolCalls
from pagedserve.services.gateway.output_processor import ChoiceUpdate
from pagedserve.services.gateway.response_formatter import ResponseFormatter

PIECES = ["Checking. ", "<tool_call>\n", '{"name": "get_weather", ', '"arguments": {"city"',
          ': "Paris"}}\n</tool_call>']  # fmt: skip


def invocations(metrics: GatewayMetrics) -> dict[tuple[str, str, str], float]:
    text = metrics.render([]).decode()
    found = re.findall(r'^vllm:tool_call_parser_invocations_total\{mode="(\w+)",model_name="m",'
                       r'outcome="(\w+)",request_type="(\w+)"\} (\S+)$', text, re.M)  # fmt: skip
    return {(mode, outcome, kind): float(v) for mode, outcome, kind, v in found}


def test_every_label_set_exists_at_zero():
    counts = invocations(GatewayMetrics("m"))
    assert len(counts) == 12 and set(counts.values()) == {0.0}


def test_a_stream_counts_each_delta_and_whether_it_carried_a_call():
    metrics = GatewayMetrics("m")
    formatter = ResponseFormatter("chat", "id", "m", 0, False, mode=HermesToolCalls(),
                                  on_tool_parse=metrics.requests.tool_parser_invoked)  # fmt: skip
    for position, piece in enumerate(PIECES):
        finish = "stop" if position == len(PIECES) - 1 else None
        formatter.chunk(0, ChoiceUpdate(piece, [], finish), processor=None)
    counts = invocations(metrics)
    called = counts["streaming", "tool_call", "chat_completions"]
    assert called >= 1 and called + counts["streaming", "no_tool_call", "chat_completions"] == 5
    assert counts["non_streaming", "tool_call", "chat_completions"] == 0


def test_a_whole_output_counts_once_per_choice():
    seen: list[tuple[bool, bool]] = []
    formatter = ResponseFormatter("chat", "id", "m", 0, False, mode=HermesToolCalls(),
                                  on_tool_parse=lambda *args: seen.append(args))  # fmt: skip
    for text in ("".join(PIECES), "It is sunny."):
        processor = SimpleNamespace(text=text, finish_reason="stop", stop_reason=None)
        formatter._full_choice(0, processor, [])  # type: ignore[arg-type]
    assert seen == [(False, True), (False, False)]
