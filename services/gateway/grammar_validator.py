"""Checks that a structured-output spec compiles, before its request is queued: a JSON schema
must be a valid schema (jsonschema's meta-schema check) that xgrammar can turn into a grammar;
a regex, an EBNF grammar or a Lark grammar must parse (xgrammar's own Lark front end, whose
errors name the construct it does not support, with line and column). Results are cached by
spec, so a schema that many requests share is checked once.

xgrammar is imported on a worker thread at the first structured request (it pulls in torch,
which the rest of the gateway does not need), and every check runs there too: the event loop
never waits on a grammar."""

from __future__ import annotations

import asyncio
import json
import re
from collections import OrderedDict

from pagedserve.services.gateway.errors import bad_request
from pagedserve.services.gateway.structured_outputs import StructuredRequest
from pagedserve.shared.protocol import StructuredOutput

MAX_CACHED_SPECS = 1024
# xgrammar prefixes its messages (and those it nests, such as a Lark grammar's bad regex)
# with "[time] /path/file.cc:line: "
_LIBRARY_PREFIX = re.compile(r"\[[\d:]+\] \S+:\d+: ")
# special tokens (`<|im_end|>`) are an xgrammar extension of Lark that needs the vocabulary
_SPECIAL_TOKEN_ERROR = "requires tokenizer_info"


def library_error(spec: StructuredOutput) -> str | None:
    """Why `spec` does not compile, or None when it does."""
    import jsonschema
    import xgrammar

    try:
        if spec.kind == "json":
            schema = json.loads(spec.spec)
            jsonschema.validators.validator_for(schema).check_schema(schema)
            xgrammar.Grammar.from_json_schema(spec.spec, any_whitespace=False)
        elif spec.kind == "regex":
            xgrammar.Grammar.from_regex(spec.spec)
        elif spec.kind == "grammar":
            xgrammar.Grammar.from_ebnf(spec.spec)
        elif spec.kind == "lark":
            xgrammar.Grammar.from_lark(spec.spec)
        elif spec.kind == "structural_tag":
            xgrammar.Grammar.from_structural_tag(spec.spec)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        return f"the JSON schema is invalid at {where}: {exc.message}"
    except Exception as exc:  # xgrammar raises RuntimeError with its parser's reason
        message = _LIBRARY_PREFIX.sub("", str(exc).strip())
        if _SPECIAL_TOKEN_ERROR in message:
            message = message.replace(_SPECIAL_TOKEN_ERROR, "is not supported here")
        return message
    return None


class GrammarValidator:
    """`check(structured)`: a 400 naming the parameter when its spec does not compile."""

    def __init__(self) -> None:
        self._errors: OrderedDict[StructuredOutput, str | None] = OrderedDict()

    async def check(self, structured: StructuredRequest | None) -> None:
        if structured is None:
            return
        spec = structured.output
        if spec in self._errors:
            self._errors.move_to_end(spec)
            error = self._errors[spec]
        else:
            error = await asyncio.to_thread(library_error, spec)
            self._errors[spec] = error
            if len(self._errors) > MAX_CACHED_SPECS:
                self._errors.popitem(last=False)
        if error is not None:
            what = {"json": "JSON schema", "regex": "regex", "grammar": "EBNF grammar",
                    "lark": "Lark grammar", "structural_tag": "tool schema"}[spec.kind]  # fmt: skip
            hint = {"grammar": " (EBNF/GBNF: root ::= ...; or Lark: start: ...)",
                    "lark": " (Lark: start: ...)"}.get(spec.kind, "")  # fmt: skip
            raise bad_request(
                f"`{structured.param}` holds an invalid {what}{hint}: {error}", structured.param
            )
