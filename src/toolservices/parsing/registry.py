"""Find a parser family by the names vLLM uses (``--tool-call-parser``)."""

from __future__ import annotations

from typing import Any

from toolservices.errors import UserError
from toolservices.parsing.base import DEFAULT_MAX_CHARS, ToolParser, check_max_chars
from toolservices.parsing.gemma import FunctionGemmaParser, Gemma4Parser
from toolservices.parsing.json_families import (
    ErnieParser,
    GigaChat3Parser,
    Granite20bFCParser,
    GraniteParser,
    HermesParser,
    HunyuanParser,
    InternLMParser,
    JambaParser,
    Llama3JSONParser,
    LongcatParser,
    MiniMaxM1Parser,
    MistralParser,
    Phi4MiniParser,
    XLAMParser,
)
from toolservices.parsing.pythonic import (
    Lfm2Parser,
    Llama4PythonicParser,
    Olmo3Parser,
    PythonicParser,
)
from toolservices.parsing.special_tokens import (
    DeepSeekV3Parser,
    DeepSeekV31Parser,
    HarmonyParser,
    KimiK2Parser,
)
from toolservices.parsing.torchrl_formats import (
    JSONCallParser,
    PythonBlockParser,
    SimpleToolParser,
    XMLBlockParser,
)
from toolservices.parsing.xml_families import (
    DeepSeekV4Parser,
    DeepSeekV32Parser,
    Glm45Parser,
    MiniMaxM2Parser,
    Qwen3CoderParser,
    SeedOssParser,
    Step3Parser,
)

__all__ = ["ALIASES", "PARSERS", "available_parsers", "get_parser"]

#: Canonical family name -> class.
PARSERS: dict[str, type[ToolParser]] = {
    cls.name: cls
    for cls in (
        XMLBlockParser,
        JSONCallParser,
        PythonBlockParser,
        SimpleToolParser,
        HermesParser,
        Llama3JSONParser,
        MistralParser,
        PythonicParser,
        Qwen3CoderParser,
        DeepSeekV3Parser,
        DeepSeekV31Parser,
        DeepSeekV32Parser,
        Llama4PythonicParser,
        Olmo3Parser,
        GraniteParser,
        Granite20bFCParser,
        InternLMParser,
        JambaParser,
        HunyuanParser,
        KimiK2Parser,
        Glm45Parser,
        MiniMaxM1Parser,
        MiniMaxM2Parser,
        HarmonyParser,
        XLAMParser,
        Phi4MiniParser,
        Step3Parser,
        SeedOssParser,
        LongcatParser,
        GigaChat3Parser,
        ErnieParser,
        FunctionGemmaParser,
        Gemma4Parser,
        DeepSeekV4Parser,
        Lfm2Parser,
    )
}

#: Other names for the same family (vLLM aliases and model names).
ALIASES: dict[str, str] = {
    "qwen3_json": "hermes",
    "qwen": "hermes",
    "qwen25": "hermes",
    "llama4_json": "llama3_json",
    "qwen3_xml": "qwen3_coder",
    "glm47": "glm45",
    "gpt_oss": "openai",
    "harmony": "openai",
    # Same syntax as an existing family (checked against the published templates):
    "nemotron_v3": "qwen3_coder",  # NVIDIA Nemotron 3 Nano/Super
    "nemotron3": "qwen3_coder",
    "qwen3_5": "qwen3_coder",  # Qwen3.5
    "qwen3_6": "qwen3_coder",  # Qwen3.6
    "deepseekv4": "deepseek_v4",  # SGLang's name
    "lfm2_5": "lfm2",  # LFM2.5
}


def available_parsers() -> list[str]:
    """Every accepted name (families and aliases), sorted."""
    return sorted({*PARSERS, *ALIASES})


def _canonical(name: str) -> str:
    key = name.strip().lower()
    if key in PARSERS:
        return key
    if key in ALIASES:
        return ALIASES[key]
    dashed = key.replace("_", "-")
    if dashed in PARSERS:
        return dashed
    underscored = key.replace("-", "_")
    if underscored in PARSERS:
        return underscored
    if underscored in ALIASES:
        return ALIASES[underscored]
    raise UserError(
        f"Unknown tool-call parser {name!r}. Valid names: {', '.join(available_parsers())}"
    )


def get_parser(
    name: str | ToolParser, *, tools: Any = None, max_chars: int | None = DEFAULT_MAX_CHARS
) -> ToolParser:
    """The parser family called ``name`` (see ``docs/formats``), or ``name`` itself.

    ``tools`` (OpenAI-style specs or a :class:`~toolservices.ToolRegistry`)
    lets schema-typed formats such as ``qwen3_coder`` convert raw text values.
    ``max_chars``: longer responses get one ``too_long`` parse error instead
    of being parsed (``None``: no limit). A :class:`ToolParser` instance is
    returned unchanged.
    """
    if isinstance(name, ToolParser):
        return name
    if not isinstance(name, str):
        raise UserError(
            f"get_parser() takes a parser name or a ToolParser, got {type(name).__name__}"
        )
    limit = check_max_chars(max_chars)
    parser = PARSERS[_canonical(name)](tools=tools)
    parser.max_chars = limit
    return parser
