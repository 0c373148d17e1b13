"""Whether this gateway can serve tool_choice "auto", checked per request: the model must be
shown its tools by the chat template (which must render `tools`) and the gateway must read
its calls back (--enable-auto-tool-choice with --tool-call-parser). A request that asks for
"auto" where either is missing is a 400 that says which flag is needed."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.gateway.chat_template import renders_tools
from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.gateway_config import GatewayConfig
from pagedserve.services.gateway.openai_schema import ChatRequest
from pagedserve.services.gateway.tokenizer import TokenizerInfo

_ALTERNATIVE = "; or use tool_choice 'required' or name a function"


@dataclass(frozen=True)
class AutoTools:
    enabled: bool  # --enable-auto-tool-choice with a --tool-call-parser
    template_renders_tools: bool

    @classmethod
    def of(cls, config: GatewayConfig, info: TokenizerInfo) -> AutoTools:
        template = getattr(info.tokenizer, "chat_template", None)
        enabled = config.enable_auto_tool_choice and config.tool_call_parser is not None
        return cls(enabled, renders_tools(template if isinstance(template, str) else None))

    def check(self, request: ChatRequest) -> None:
        if not request.auto_tools:
            return
        if not self.enabled:
            raise bad_request(
                "`tool_choice` 'auto' (the default when `tools` are given) needs the server "
                "started with --enable-auto-tool-choice --tool-call-parser hermes and a chat "
                "template that renders `tools` (--chat-template FILE)" + _ALTERNATIVE,
                "tool_choice",
            )
        if not self.template_renders_tools:
            raise bad_request(
                "`tool_choice` 'auto' needs a chat template that shows the model its tools, "
                "and this model's does not render `tools`: start the server with "
                "--chat-template FILE (a Hermes-style template)" + _ALTERNATIVE,
                "tool_choice",
            )
