"""Tool-call parsers for the formats real models emit.

``get_parser(name, tools=...)`` returns a family by its vLLM name
(``hermes``, ``qwen3_coder``, ``mistral``...). Every parser maps a response
(text or chat message dict) to a :class:`ParseResult`: visible text, calls in
order, parse errors. ``parser.render(calls, text)`` writes calls back in the
family's own syntax. ``as_parser(x)`` turns anything a ``parser=`` argument
accepts (a name, a parser, a callable, ``None``) into such a callable.
"""

from toolservices.parsing._as_parser import ParserLike, ServerCallsParser, as_parser
from toolservices.parsing.base import (
    LLMToolParser,
    ParseError,
    ParseFailure,
    ParseResult,
    ToolCall,
    ToolParser,
    make_call_id,
    response_text,
)
from toolservices.parsing.json_families import (
    HermesParser,
    Llama3JSONParser,
    MistralParser,
)
from toolservices.parsing.pythonic import PythonicParser
from toolservices.parsing.registry import available_parsers, get_parser
from toolservices.parsing.special_tokens import DeepSeekV3Parser
from toolservices.parsing.torchrl_formats import (
    JSONCallParser,
    PythonBlockParser,
    RegexParser,
    SimpleToolParser,
    XMLBlockParser,
)
from toolservices.parsing.xml_families import Qwen3CoderParser

__all__ = [
    "DeepSeekV3Parser",
    "HermesParser",
    "JSONCallParser",
    "LLMToolParser",
    "Llama3JSONParser",
    "MistralParser",
    "ParseError",
    "ParseFailure",
    "ParseResult",
    "ParserLike",
    "PythonBlockParser",
    "PythonicParser",
    "Qwen3CoderParser",
    "RegexParser",
    "ServerCallsParser",
    "SimpleToolParser",
    "ToolCall",
    "ToolParser",
    "XMLBlockParser",
    "as_parser",
    "available_parsers",
    "get_parser",
    "make_call_id",
    "response_text",
]
