"""Tool-call parsers for the formats real models emit."""

from toolservices.parsing.base import (
    LLMToolParser,
    ParseError,
    ParseResult,
    ToolCall,
    ToolParser,
    make_call_id,
)

__all__ = ["LLMToolParser", "ParseError", "ParseResult", "ToolCall", "ToolParser", "make_call_id"]
