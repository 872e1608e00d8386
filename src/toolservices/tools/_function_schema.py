"""Describe a typed Python function as a tool: JSON Schema plus validator.

One pure function, :func:`function_schema`, reads the signature, the type
hints and the docstring and returns a small record. It is built only on
pydantic's public API. Every problem with the signature is collected and
reported at once, naming the function.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic.fields import FieldInfo

from toolservices.errors import ToolArgumentError, ToolDefinitionError

__all__ = ["STATE_PARAMETER", "FunctionSchema", "function_schema", "parse_docstring"]

#: The keyword under which tools receive the per-call state (TorchRL's name).
STATE_PARAMETER = "_state"

_GOOGLE_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:\s*$", re.IGNORECASE)
_ANY_SECTION = re.compile(r"^\s*[A-Z][A-Za-z ]*:\s*$")
_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_ARG = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its summary and per-argument descriptions.

    Understands Google (``Args:``), Sphinx (``:param x:``) and NumPy
    (``Parameters`` + dashes) styles; anything else is summary text.
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    section: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if _GOOGLE_SECTION.match(line):
            section, current = "google", None
        elif line.strip().lower() == "parameters" and _NUMPY_RULE.match(nxt):
            section, current = "numpy", None
            i += 1
        elif m := _SPHINX_ARG.match(line):
            section, current = "sphinx", m.group(1)
            params[current] = m.group(2).strip()
        elif section == "google" and _ANY_SECTION.match(line) and not line.startswith(" "):
            section, current = "other", None
        elif section == "numpy" and _NUMPY_RULE.match(nxt):
            section, current = "other", None
            i += 1
        elif (
            section == "google"
            and (m := _GOOGLE_ARG.match(line))
            and (len(line) - len(line.lstrip()) <= 4)
        ):
            current = m.group(1).lstrip("*")
            params[current] = m.group(2).strip()
        elif section == "numpy" and line and not line.startswith(" "):
            current = line.split(":")[0].strip()
            params[current] = ""
        elif section in ("google", "numpy", "sphinx") and current and line.strip():
            params[current] = (params[current] + " " + line.strip()).strip()
        elif section is None:
            summary.append(line)
        i += 1
    return "\n".join(summary).strip(), params


class _ArgsBase(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


@dataclass(frozen=True, kw_only=True)
class FunctionSchema:
    """What a function looks like to a model, and how to check its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    model: type[BaseModel]
    is_async: bool
    accepts_state: bool
    accepts_var_kwargs: bool

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Return the validated, type-converted keyword arguments.

        Raises :class:`ToolArgumentError` with one line per problem.
        """
        try:
            model = self.model.model_validate(args)
        except ValidationError as exc:
            raise ToolArgumentError(_format_validation(self.name, exc)) from None
        return {name: getattr(model, name) for name in type(model).model_fields}


def _format_validation(tool: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        if err["type"] == "missing":
            lines.append(f"missing required argument '{where}'")
        elif err["type"] == "extra_forbidden":
            lines.append(f"unexpected argument '{where}'")
        else:
            lines.append(f"argument '{where}': {err['msg']} (got {err.get('input')!r:.60})")
    return f"Invalid arguments for tool '{tool}': " + "; ".join(lines)


def function_schema(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
) -> FunctionSchema:
    """Describe ``fn`` as a tool.

    Steps: 1. read the signature and resolve the type hints; 2. read the
    docstring; 3. build a pydantic model of the parameters, leaving out the
    state parameter and ``**kwargs``; 4. derive the JSON Schema.
    """
    qualname = getattr(fn, "__qualname__", repr(fn))
    problems: list[str] = []
    # 1. signature and hints
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"Cannot build a tool from {qualname}: {exc}") from None
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:  # any error while evaluating annotations
        raise ToolDefinitionError(
            f"Cannot build a tool from {qualname}: its type hints do not resolve ({exc})"
        ) from None
    # 2. docstring
    summary, arg_docs = parse_docstring(inspect.getdoc(fn))
    # 3. parameters
    fields: dict[str, Any] = {}
    accepts_state = False
    accepts_var_kwargs = False
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            accepts_var_kwargs = True
            continue
        if param.name == STATE_PARAMETER:
            accepts_state = True
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            problems.append(f"*{param.name}: tools take keyword arguments only")
            continue
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            problems.append(f"{param.name}: positional-only parameters cannot be named by a model")
            continue
        if param.name.startswith("_"):
            problems.append(f"{param.name}: parameter names starting with '_' are reserved")
            continue
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        field = FieldInfo.merge_field_infos(
            FieldInfo.from_annotated_attribute(annotation, default),
            description=arg_docs.get(param.name) or None,
        )
        fields[param.name] = (annotation, field)
    for documented in arg_docs:
        if documented not in signature.parameters and documented not in ("kwargs", "args"):
            problems.append(f"docstring describes '{documented}', which is not a parameter")
    tool_name: str = name or str(getattr(fn, "__name__", ""))
    if not tool_name or not re.fullmatch(r"[A-Za-z_][\w.\-]*", tool_name):
        problems.append(f"tool name {tool_name!r} is not a valid identifier")
    model: type[BaseModel] | None = None
    if not problems:
        try:
            model = create_model(f"{tool_name}_args", __base__=_ArgsBase, **fields)
            parameters = model.model_json_schema()
        except Exception as exc:  # pydantic reports unsupported types many ways
            problems.append(f"cannot describe the parameters as JSON Schema: {exc}")
    if problems:
        listing = "\n  ".join(problems)
        raise ToolDefinitionError(f"Cannot build a tool from {qualname}:\n  {listing}")
    assert model is not None
    parameters.pop("title", None)
    for prop in parameters.get("properties", {}).values():
        prop.pop("title", None)
    return FunctionSchema(
        name=tool_name,
        description=description if description is not None else summary,
        parameters=parameters,
        model=model,
        is_async=inspect.iscoroutinefunction(fn),
        accepts_state=accepts_state or accepts_var_kwargs,
        accepts_var_kwargs=accepts_var_kwargs,
    )
