"""Request bodies of the judge's HTTP API (SandboxFusion's fields and defaults), and
validation errors shaped as FastAPI answers them (HTTP 422, ``{"detail": [...]}``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

__all__ = ["RunCodeRequest", "RunJupyterRequest", "RunTestsRequest", "parse_body"]

Language = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash",
    "typescript", "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala",
    "julia", "pytest", "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean",
    "swift", "racket",
]  # fmt: skip


class RunCodeRequest(BaseModel):
    """``POST /run_code``: SandboxFusion's fields and defaults."""

    compile_timeout: float = 10
    run_timeout: float = 10
    memory_limit_MB: int = -1  # noqa: N815 - the wire name
    code: str
    stdin: str | None = None
    language: Language
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class RunJupyterRequest(BaseModel):
    """``POST /run_jupyter``: SandboxFusion's fields and defaults."""

    cells: list[str]
    cell_timeout: float = 0
    total_timeout: float = 45
    memory_limit_MB: int = -1  # noqa: N815 - the wire name
    kernel: Literal["python3"] = "python3"
    files: dict[str, str] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class Case(BaseModel):
    """One case of ``POST /run_tests``: its input, the expected output, its own limits."""

    stdin: str | None = None
    expected_stdout: str | None = None
    run_timeout: float | None = None
    memory_limit_MB: int | None = None  # noqa: N815 - the wire name


class RunTestsRequest(BaseModel):
    """``POST /run_tests``: one program, many cases (this server's own endpoint)."""

    code: str
    language: Language
    cases: list[Case]
    compile_timeout: float = 10
    run_timeout: float = 10
    memory_limit_MB: int = -1  # noqa: N815 - the wire name
    files: dict[str, str | None] = Field(default_factory=dict)
    float_tolerance: float | None = Field(default=None, ge=0)
    stop_on_first_failure: bool = False


def _detail(errors: list[Any]) -> dict[str, Any]:
    # FastAPI's shape: pydantic's errors with "body" before each location
    return {"detail": [{**e, "loc": ["body", *e["loc"]]} for e in errors]}


def parse_body(model: type[BaseModel], raw: bytes) -> tuple[BaseModel | None, dict[str, Any]]:
    """The validated request, or ``(None, body of the 422 answer)``."""
    try:
        data = json.loads(raw) if raw.strip() else None
    except ValueError as exc:
        pos = exc.pos if isinstance(exc, json.JSONDecodeError) else 0
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        return None, {
            "detail": [
                {
                    "type": "json_invalid",
                    "loc": ["body", pos],
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": msg},
                }
            ]
        }
    if data is None:
        return None, {
            "detail": [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]
        }
    try:
        return model.model_validate(data), {}
    except ValidationError as exc:
        # with the docs URL, as SandboxFusion's FastAPI (0.103) gives it
        errors = json.loads(exc.json(include_url=True))
        return None, _detail(errors)
