"""Lark grammars in `structured_outputs.grammar` / `guided_grammar`: told apart from EBNF,
compiled by xgrammar's Lark front end, and their unsupported constructs refused by name; what
the compiled grammar accepts is what the `lark` package parses."""

from __future__ import annotations

import asyncio

import lark
import pytest

from pagedserve.services.gateway.errors import APIError
from pagedserve.services.gateway.grammar_syntax import is_lark
from pagedserve.services.gateway.grammar_validator import GrammarValidator, library_error
from pagedserve.services.gateway.openai_schema import parse_chat_request, parse_completion_request
from pagedserve.shared.protocol import StructuredOutput

ARITHMETIC = """
?start: sum
?sum: product | sum ("+" | "-") product
?product: atom | product "*" atom
?atom: NUMBER | "(" sum ")"
%import common.NUMBER
"""
ASSIGNMENT = """
// a comment that mentions root ::= does not make it EBNF
start: CNAME "=" value ("," CNAME "=" value)*
value: ESCAPED_STRING | INT | WORD
%import common.CNAME
%import common.ESCAPED_STRING
%import common.INT
%import common.WORD
"""
FEATURES = r"""
start: greeting [NAME] TAIL? item+
greeting: "hello"i | "hi"
NAME: /[A-Z][a-z]{1,5}/
TAIL: "!"
item: ("," DIGIT) | ";" LETTER
%import common.DIGIT
%import common.LETTER
"""
SPACED = """
start: WORD ("," WORD)*
%import common.WORD
%import common.WS
%ignore WS
"""


def matcher_accepts(grammar: str, text: str) -> bool:
    """Whether the compiled Lark grammar accepts `text` whole (fed as bytes, no tokenizer)."""
    import xgrammar

    info = xgrammar.TokenizerInfo([])
    compiled = xgrammar.GrammarCompiler(info).compile_lark(grammar)
    matcher = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


@pytest.mark.parametrize(
    ("grammar", "lark_syntax"),
    [
        (ARITHMETIC, True),
        (ASSIGNMENT, True),
        ('start: "a"', True),
        ("%import common.WS\nstart: WS", True),
        ('A.2: "a"\nstart: A', True),
        ('root ::= "a" | "b"', False),
        ('root ::= item+ # start: x\nitem ::= "x"', False),
        ("not a grammar at all", False),
    ],
)
def test_lark_is_told_apart_from_ebnf(grammar, lark_syntax):
    assert is_lark(grammar) is lark_syntax


def test_both_grammar_fields_carry_a_lark_spec():
    for body in ({"guided_grammar": ARITHMETIC}, {"structured_outputs": {"grammar": ARITHMETIC}}):
        for parse, base in ((parse_chat_request, {"messages": [{"role": "user", "content": "x"}]}),
                            (parse_completion_request, {"prompt": "x"})):  # fmt: skip
            structured = parse({**base, **body}).sampling.structured
            assert structured is not None
            assert structured.output == StructuredOutput("lark", ARITHMETIC)


@pytest.mark.parametrize(
    ("grammar", "accepted", "refused"),
    [
        (ARITHMETIC, ["1+2*3", "(4-1.5)*2", "7"], ["1+", "+1", "(1", "a"]),
        (ASSIGNMENT, ['x="y",n=3', "a_1=word"], ["x=", "1x=2", 'x="y",']),
        (FEATURES, ["HELLOBob!,1;a", "hi;z,9", "HeLlO,0"], ["hello", "hiBob", "hey,1"]),
        (SPACED, ["a,b", "a , b", "abc ,\tdef"], ["a,", ",a", "a b"]),
    ],
)
def test_compiled_lark_accepts_what_the_lark_package_parses(grammar, accepted, refused):
    parser = lark.Lark(grammar, parser="earley")
    for text in accepted:
        parser.parse(text)  # the reference agrees
        assert matcher_accepts(grammar, text), text
    for text in refused:
        with pytest.raises(lark.exceptions.LarkError):
            parser.parse(text)
        assert not matcher_accepts(grammar, text), text


@pytest.mark.parametrize(
    ("grammar", "fragment"),
    [
        ('_sep{x, sep}: x (sep x)*\nstart: _sep{"a", ","}', "templates are not supported"),
        ('A.2: "a"\nstart: A', "priorities are not supported"),
        ('%declare FOO\nstart: "a"', "%declare is not supported"),
        ('%override start: "a"', "%override is not supported"),
        ('start: /a(?=b)/ "b"', "Lookahead is not supported"),
        ("start: <|im_end|>", "special token <|im_end|> is not supported"),
        ("start: undefined_rule", "unknown name 'undefined_rule'"),
        ('rule: "a"', "no start rule"),
    ],
)
def test_unsupported_lark_constructs_are_named(grammar, fragment):
    error = library_error(StructuredOutput("lark", grammar))
    assert error is not None and fragment in error, error
    assert "/project/" not in error and ("line 1" in error or "line 2" in error)


def test_an_invalid_lark_grammar_is_a_400_before_anything_is_queued():
    body = {"prompt": "x", "guided_grammar": "start: nothing_here"}
    structured = parse_completion_request(body).sampling.structured
    with pytest.raises(APIError) as info:
        asyncio.run(GrammarValidator().check(structured))
    assert info.value.status == 400 and info.value.param == "guided_grammar"
    assert "invalid Lark grammar" in info.value.message
    assert "unknown name 'nothing_here'" in info.value.message
