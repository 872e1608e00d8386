"""The tool contract and its two implementations.

:class:`Tool` is what the dispatcher runs. It covers TorchRL's
``ToolService`` shape (``name``, ``schema_in``, ``schema_out``,
``__call__(**kwargs)``) and adds a description, argument validation, an
async entry point and the OpenAI-style spec that chat templates take.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, overload, runtime_checkable

import anyio.to_thread

from toolservices.errors import (
    ToolArgumentError,
    ToolDefinitionError,
    ToolExecutionError,
    describe_exception,
)
from toolservices.tools._function_schema import STATE_PARAMETER, function_schema
from toolservices.tools.jsonschema import schema_errors

__all__ = ["FunctionTool", "ServiceTool", "Tool", "ToolService", "as_tool", "tool"]

F = TypeVar("F", bound=Callable[..., Any])


@runtime_checkable
class ToolService(Protocol):
    """TorchRL's tool service shape: anything with these is usable as a tool."""

    name: str
    schema_in: dict[str, Any]
    schema_out: dict[str, Any]

    def __call__(self, **kwargs: Any) -> Any: ...


class Tool(ABC):
    """A callable tool with a name, a description and an argument schema."""

    name: str
    description: str
    #: JSON Schema of the arguments (an ``object`` schema).
    schema_in: dict[str, Any]
    #: JSON Schema of the result, when known (``{}`` otherwise).
    schema_out: dict[str, Any]
    #: Whether the tool wants the per-call state as ``_state=``.
    accepts_state: bool = False
    #: Whether :meth:`acall` is native (no thread needed).
    is_async: bool = False
    #: Per-tool time limit in seconds; ``None`` uses the dispatcher's.
    timeout: float | None = None

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``args`` and return them converted; raise ToolArgumentError."""
        errors = schema_errors(self.schema_in, args)
        if errors:
            raise ToolArgumentError(
                f"Invalid arguments for tool '{self.name}': " + "; ".join(errors)
            )
        return dict(args)

    @abstractmethod
    def __call__(self, **kwargs: Any) -> Any:
        """Run the tool synchronously (in a worker thread when dispatched)."""

    async def acall(self, **kwargs: Any) -> Any:
        """Run the tool from async code; sync tools go to a worker thread.

        A cancelled caller (a timeout) stops waiting at once; the thread,
        which Python cannot kill, finishes in the background and its result is
        dropped. Without this a time limit around a blocking tool would only
        take effect after the tool returned. A ``SystemExit``,
        ``KeyboardInterrupt`` or other non-``Exception`` the tool raises in
        its thread comes back as :class:`ToolExecutionError`: raised into the
        event loop as it is, it would stop the loop.
        """
        return await anyio.to_thread.run_sync(
            functools.partial(_call_in_thread, self, kwargs), abandon_on_cancel=True
        )

    def openai_spec(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` entry for ``tools=``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.schema_in or {"type": "object", "properties": {}},
            },
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionTool(Tool):
    """A tool made from a typed Python function (sync or async)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
    ) -> None:
        schema = function_schema(fn, name=name, description=description)
        self.fn = fn
        self._schema = schema
        self.name = schema.name
        self.description = schema.description
        self.schema_in = schema.parameters
        self.schema_out = {}
        self.accepts_state = schema.accepts_state
        self.is_async = schema.is_async
        self.timeout = timeout

    def validate(self, args: Mapping[str, Any]) -> dict[str, Any]:
        if self._schema.accepts_var_kwargs:
            known = {k: v for k, v in args.items() if k in self._schema.model.model_fields}
            extra = {k: v for k, v in args.items() if k not in known}
            return {**self._schema.validate(known), **extra}
        return self._schema.validate(dict(args))

    def __call__(self, **kwargs: Any) -> Any:
        if self.is_async:
            raise TypeError(f"tool '{self.name}' is async: use 'await tool.acall(...)'")
        return self.fn(**kwargs)

    async def acall(self, **kwargs: Any) -> Any:
        if self.is_async:
            return await self.fn(**kwargs)
        return await super().acall(**kwargs)


class ServiceTool(Tool):
    """Adapts a TorchRL-style service object (or any named callable) to a Tool.

    The service is called as it is; its ``schema_in`` is checked with the
    small JSON Schema checker before the call.
    """

    def __init__(self, service: Any, *, description: str | None = None) -> None:
        name = getattr(service, "name", None)
        if not isinstance(name, str) or not name:
            raise ToolDefinitionError(
                f"Cannot use {service!r} as a tool: it has no 'name' string attribute"
            )
        if not callable(service):
            raise ToolDefinitionError(f"Cannot use {service!r} as a tool: it is not callable")
        self.service = service
        self.name = name
        doc = description or getattr(service, "description", None)
        self.description = doc if isinstance(doc, str) else (inspect.getdoc(service) or "")
        self.schema_in = dict(getattr(service, "schema_in", None) or {})
        self.schema_out = dict(getattr(service, "schema_out", None) or {})
        self.is_async = inspect.iscoroutinefunction(service) or inspect.iscoroutinefunction(
            type(service).__call__
        )
        self.accepts_state = _accepts_keyword(service, STATE_PARAMETER)

    def __call__(self, **kwargs: Any) -> Any:
        return self.service(**kwargs)

    async def acall(self, **kwargs: Any) -> Any:
        if self.is_async:
            return await self.service(**kwargs)
        return await super().acall(**kwargs)


def _call_in_thread(tool: Tool, kwargs: dict[str, Any]) -> Any:
    try:
        return tool(**kwargs)
    except Exception:
        raise
    except BaseException as exc:  # only the tool can raise these in a worker thread
        raise ToolExecutionError(describe_exception(exc)) from exc


def _accepts_keyword(fn: Callable[..., Any], keyword: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == keyword or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


@overload
def tool(fn: F, /) -> FunctionTool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, timeout: float | None = None
) -> Callable[[F], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed, documented function into a :class:`Tool`.

    Usable bare (``@tool``) or with options (``@tool(name="search")``).
    """

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, timeout=timeout)

    return wrap(fn) if fn is not None else wrap


def as_tool(obj: Any) -> Tool:
    """A :class:`Tool` for ``obj``: a Tool, a service object or a function."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(getattr(obj, "name", None), str) and callable(obj):
        return ServiceTool(obj)
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.iscoroutinefunction(obj):
        return FunctionTool(obj)
    raise ToolDefinitionError(
        f"Cannot use {obj!r} as a tool: expected a Tool, a function, or an object with "
        "'name', 'schema_in' and '__call__'"
    )
