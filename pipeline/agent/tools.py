"""Tools for the agent loop: Python callables by dotted path, with a JSON schema from their signature.

A tool is a function (sync or async) or a class whose instances are callable; `load_tools` loads
each dotted path through the run's plugin allowlist (`pipeline.config.plugins.load_object`, the slot row
`agent_tool`) and builds a class once with its `tool_args` entry as keyword arguments. The tool's
name is the function's name (a class: its `name` attribute), its description the docstring's first
paragraph, its parameters the signature's (types from the annotations, descriptions from a
Google-style `Args:` section). `ToolRegistry.call` runs one call: arguments checked against the
schema, a timeout per attempt, a semaphore shared by the whole rollout (`max_concurrent_tools`),
retries with exponential back-off for the exception classes named in `retry_on` (matched by name
along the exception's class hierarchy), the result as text, cut at `max_result_chars`.
A synchronous tool runs in a worker thread; a timed-out thread cannot be stopped and finishes in
the background (the python tool runs a subprocess and kills it instead).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import re
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

from pipeline.config.plugins import SLOTS_BY_NAME, load_object

__all__ = ["Tool", "ToolError", "ToolOutcome", "ToolRegistry", "check_arguments", "load_tools", "tool_from"]

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                               list: "array", tuple: "array", dict: "object"}
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class ToolError(Exception):
    """A tool's own failure; its message goes back to the model as the tool result."""


@dataclass(frozen=True)
class Tool:
    """One tool: its name, callable, JSON schema (OpenAI / HF `tools=` form) and parameters."""

    name: str
    fn: Any
    schema: dict[str, Any]
    is_async: bool
    params: dict[str, dict[str, Any]]
    required: tuple[str, ...]
    takes_any: bool = False

    @property
    def first_param(self) -> str | None:
        """The first parameter (the tag format's content goes there)."""
        return next(iter(self.params), None)


@dataclass
class ToolOutcome:
    """What one call gave: the text for the model, whether it is an error, the seconds it took."""

    text: str
    error: bool = False
    timed_out: bool = False
    latency_s: float = 0.0
    attempts: int = 1
    details: dict[str, Any] = field(default_factory=dict)


def _annotation_schema(ann: Any, where: str) -> dict[str, Any]:
    if ann is inspect.Parameter.empty or ann is Any:
        return {}
    if isinstance(ann, str):  # an annotation left as text: the plain names, else any value
        ann = {t.__name__: t for t in _JSON_TYPES}.get(ann, Any)
        return {} if ann is Any else {"type": _JSON_TYPES[ann]}
    origin = typing.get_origin(ann)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(ann) if a is not type(None)]
        return _annotation_schema(options[0], where) if len(options) == 1 else {}
    if origin is typing.Literal:
        values = list(typing.get_args(ann))
        return {"enum": values, **_annotation_schema(type(values[0]), where)} if values else {}
    base = origin or ann
    if base not in _JSON_TYPES:
        raise ValueError(f"{where}: annotation {ann!r} has no JSON-schema type; use str, int, float, bool, "
                         f"list, dict (or Optional / Literal of them)")
    out: dict[str, Any] = {"type": _JSON_TYPES[base]}
    args = typing.get_args(ann)
    if base in (list, tuple) and args and args[0] is not Ellipsis:
        out["items"] = _annotation_schema(args[0], where)
    return out


def _docs(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a docstring with an optional `Args:` section."""
    text = inspect.cleandoc(doc or "")
    head, _, rest = text.partition("\nArgs:")
    description = " ".join(head.split("\n\n")[0].split())
    params: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        if line.strip() and not line.startswith((" ", "\t")):
            break  # the next section
        m = _ARG_LINE.match(line)
        if m and len(line) - len(line.lstrip()) <= 4:
            current = m.group(1)
            params[current] = m.group(2).strip()
        elif current and line.strip():
            params[current] += " " + line.strip()
    return description, params


def tool_from(obj: Any, name: str | None = None) -> Tool:
    """A `Tool` from a callable (a function, or an instance with `__call__`)."""
    fn = obj
    if not callable(obj):
        raise ValueError(f"tool {obj!r} is not callable")
    base = obj.func if isinstance(obj, functools.partial) else obj  # a partial: named and documented by its function
    target = base if inspect.isfunction(base) or inspect.ismethod(base) else base.__call__
    tool_name = name or getattr(base, "name", None) or getattr(base, "__name__", None) or type(base).__name__.lower()
    if not isinstance(tool_name, str) or not tool_name.isidentifier():
        raise ValueError(f"tool {obj!r}: its name {tool_name!r} must be an identifier")
    doc = inspect.getdoc(target) if target is not base else inspect.getdoc(base)
    if not doc and target is not base:
        doc = inspect.getdoc(type(base))
    description, param_docs = _docs(doc)
    sig = inspect.signature(obj)  # a callable instance or a partial: the parameters it is called with
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - unresolvable annotations: take them as written
        hints = {}
    params: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    takes_any = False
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            takes_any = True
            continue
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise ValueError(f"tool {tool_name}: parameter {p.name!r} cannot be passed by name; a tool takes "
                             f"keyword arguments (the call's JSON arguments)")
        prop = _annotation_schema(hints.get(p.name, p.annotation), f"tool {tool_name}, parameter {p.name}")
        if param_docs.get(p.name):
            prop["description"] = param_docs[p.name]
        params[p.name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    schema = {"type": "function", "function": {
        "name": tool_name, "description": description,
        "parameters": {"type": "object", "properties": params, "required": required}}}
    is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(fn)
    return Tool(tool_name, fn, schema, is_async, params, tuple(required), takes_any)


def load_tools(paths: tuple[str, ...] | list[str], tool_args: Mapping[str, Mapping[str, Any]],
               allowed: Any, where: str = "rollout.agent.tools") -> list[Tool]:
    """Load every tool path through the allowlist; a class is built once with `tool_args[name]`."""
    slot = SLOTS_BY_NAME["agent_tool"]
    tools: list[Tool] = []
    for i, path in enumerate(paths):
        key = f"{where}[{i}]"
        obj = load_object(path, allowed, f"{key} ({slot.where})")
        if inspect.isclass(obj):
            name = getattr(obj, "name", obj.__name__.lower())
            try:
                obj = obj(**dict(tool_args.get(name, {})))
            except TypeError as exc:
                raise ValueError(f"{key}: building the tool class {path!r} with tool_args.{name} failed: {exc}") from exc
        try:
            tool = tool_from(obj)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from exc
        if any(t.name == tool.name for t in tools):
            raise ValueError(f"{key}: a second tool named {tool.name!r} ({path!r})")
        tools.append(tool)
    return tools


def _type_ok(value: Any, prop: Mapping[str, Any]) -> bool:
    kind = prop.get("type")
    if "enum" in prop and value not in prop["enum"]:
        return False
    if kind is None:
        return True
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "array": list, "object": dict}[kind])


def check_arguments(tool: Tool, arguments: Any) -> str | None:
    """Why `arguments` do not fit `tool`'s parameters (None: they do)."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    missing = [n for n in tool.required if n not in arguments]
    unknown = sorted(set(arguments) - set(tool.params)) if not tool.takes_any else []
    problems = []
    if missing:
        problems.append(f"missing {', '.join(repr(n) for n in missing)}")
    if unknown:
        problems.append(f"unknown {', '.join(repr(n) for n in unknown)}")
    for name, value in arguments.items():
        prop = tool.params.get(name)
        if prop is not None and not _type_ok(value, prop):
            want = prop.get("enum") or prop.get("type")
            problems.append(f"{name!r} must be {want}, got {type(value).__name__}")
    if not problems:
        return None
    return "; ".join(problems) + f" (parameters: {json.dumps(tool.schema['function']['parameters']['properties'])})"


def _matches(exc: BaseException, names: tuple[str, ...]) -> bool:
    """True when a class of `exc`'s hierarchy is named in `names` (bare or module-qualified)."""
    for cls in type(exc).__mro__:
        if cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names:
            return True
    return False


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return str(value)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters cut]"


class ToolRegistry:
    """The loop's tools by name, and how one call runs (module docstring)."""

    def __init__(self, tools: list[Tool], *, timeout_s: float, retries: int, retry_on: tuple[str, ...],
                 retry_backoff_s: float, max_result_chars: int) -> None:
        self.tools = {t.name: t for t in tools}
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.retry_on = tuple(retry_on)
        self.retry_backoff_s = float(retry_backoff_s)
        self.max_result_chars = int(max_result_chars)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's JSON schema, in configuration order."""
        return [t.schema for t in self.tools.values()]

    async def _invoke(self, tool: Tool, arguments: dict[str, Any]) -> Any:
        if tool.is_async:
            return await tool.fn(**arguments)
        out = await asyncio.to_thread(tool.fn, **arguments)
        return await out if inspect.isawaitable(out) else out

    async def call(self, name: str, arguments: dict[str, Any], semaphore: asyncio.Semaphore) -> ToolOutcome:
        """Run tool `name` (known, arguments checked by the caller); never raises for a tool's failure."""
        tool = self.tools[name]
        start = time.perf_counter()
        attempt = 0
        while True:
            attempt += 1
            try:
                async with semaphore:
                    value = await asyncio.wait_for(self._invoke(tool, arguments), self.timeout_s)
                return ToolOutcome(_cut(_as_text(value), self.max_result_chars), latency_s=time.perf_counter() - start,
                                   attempts=attempt)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's tool result
                timed_out = isinstance(exc, TimeoutError)
                if attempt <= self.retries and _matches(exc, self.retry_on):
                    await asyncio.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
                    continue
                if timed_out:
                    text = f"Error: {name} timed out after {self.timeout_s:g} s"
                elif isinstance(exc, ToolError):
                    text = f"Error: {name} failed: {exc}"
                else:
                    text = f"Error: {name} failed: {type(exc).__name__}: {exc}"
                return ToolOutcome(_cut(text, self.max_result_chars), error=True, timed_out=timed_out,
                                   latency_s=time.perf_counter() - start, attempts=attempt)
