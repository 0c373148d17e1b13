"""A pipeline on the default model (SmolLM2-135M) for the structured-output and tool-call
tests, and the tool they share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import openai

from pagedserve.services.gpu_worker.default_model import ensure_model
from tests.integration.pipeline.conftest import (
    add_engine,
    add_gateway,
    new_pipeline,
    wait_until_serving,
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


@contextlib.contextmanager
def smollm2_client(redis_url: str, name: str, *gateway_args: str) -> Iterator[openai.OpenAI]:
    """An engine and one gateway (with `gateway_args`) on SmolLM2; a client of the gateway."""
    pipeline = new_pipeline(redis_url, ensure_model("smollm2"))
    try:
        add_engine(pipeline, f"engine-{name}")
        add_gateway(pipeline, f"gw-{name}", *gateway_args)
        wait_until_serving(pipeline, timeout_s=300)
        yield openai.OpenAI(
            base_url=f"{pipeline.base_url()}/v1", api_key="unused", max_retries=0, timeout=300
        )
    finally:
        pipeline.stop()
