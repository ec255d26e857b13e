"""Python tools: decorate a function; its type hints become the argument schema and its validation."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from planweave.core.context import current_step_var
from planweave.core.errors import ToolError, did_you_mean
from planweave.core.plan.cache import CachePolicy, declared_policy
from planweave.tools.isolation import run_in_process, run_in_thread


def _model_for(fn: Callable[..., Any], name: str) -> tuple[type[BaseModel] | None, bool]:
    """Build an argument model from ``fn``'s signature; return (model, accepts_extra).

    Parameters whose names clash with BaseModel attributes (``json``, ``copy``, ...) become fields with a trailing
    underscore and the parameter name as alias.
    """
    sig = inspect.signature(fn)
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception:
        hints = {}
    fields: dict[str, Any] = {}
    extra = False
    for pname, param in sig.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            continue
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        annotation = hints.get(pname, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        if hasattr(BaseModel, pname):
            fields[pname + "_"] = (annotation, Field(default, alias=pname))
        else:
            fields[pname] = (annotation, default)
    if not fields and extra:
        return None, True
    # defer_build: pydantic builds the validator on the first call or check, not for every tool a toolbox holds
    # (the built-ins alone cost ~10 ms of every ``planweave`` start-up otherwise; docs/benchmarks.md, start-up).
    config = ConfigDict(extra="allow" if extra else "forbid", arbitrary_types_allowed=True, populate_by_name=True,
                        defer_build=True)
    model = create_model(f"{name.replace('.', '_')}_args", __config__=config, **fields)
    return model, extra


class _ArgsSchema(Mapping[str, Any]):
    """The JSON schema of an argument model, generated when first read (most tools' schemas are never read)."""

    def __init__(self, model: type[BaseModel]) -> None:
        self._model = model
        self._schema: dict[str, Any] | None = None

    def _built(self) -> dict[str, Any]:
        if self._schema is None:
            schema = self._model.model_json_schema()
            schema.pop("title", None)
            self._schema = schema
        return self._schema

    def __getitem__(self, key: str) -> Any:
        return self._built()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())

    def __repr__(self) -> str:
        return repr(self._built())


CacheOption = bool | Mapping[str, Any] | CachePolicy | None
"""A tool's ``cache=``: ``True``, ``{"ttl": seconds}``, or ``False``/``None`` (docs/caching.md)."""


@dataclass(frozen=True)
class Tool:
    """A callable tool with a name, a description, an argument schema and an idempotency default.

    ``cache`` (idempotent tools only) lets a step reuse the output of an earlier call with the same arguments in
    the journal; ``version`` is part of that reuse's key (bump it when the tool's results change).
    """

    name: str
    fn: Callable[..., Any]
    description: str = ""
    idempotent: bool = False
    args_model: type[BaseModel] | None = None
    accepts_extra: bool = True
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    is_async: bool = True
    cache: CachePolicy | None = None
    version: str = ""
    speculate: bool = True
    """False: steps calling the tool never start speculatively, even when idempotent (docs/speculation.md)."""
    def __post_init__(self) -> None:
        if self.cache is not None and not self.idempotent:
            raise ValueError(f"tool '{self.name}' cannot be cached: it is not idempotent (declare idempotent=True "
                             "if a call has no effects; a cached output is only reused for such a call)")

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
        idempotent: bool = False, cache: CacheOption = None, version: str = "", speculate: bool = True,
    ) -> Tool:
        tool_name = name or fn.__name__
        doc = description if description is not None else inspect.getdoc(fn) or ""
        model, extra = _model_for(fn, tool_name)
        schema: Mapping[str, Any] = (
            _ArgsSchema(model) if model is not None else {"type": "object", "additionalProperties": True}
        )
        return cls(
            name=tool_name,
            fn=fn,
            description=doc.strip(),
            idempotent=idempotent,
            args_model=model,
            accepts_extra=extra,
            input_schema=schema,
            is_async=inspect.iscoroutinefunction(fn),
            cache=declared_policy(cache, tool=tool_name),
            version=version,
            speculate=speculate,
        )

    @cached_property
    def plain_output(self) -> bool:
        """The function is async and its return annotation says plain JSON data (no pydantic model to dump): its
        coroutine is the call's (:meth:`invoke`), with no coroutine of the tool's own around it. Derived from
        ``fn`` on first use (resolving the annotation costs ~0.2 ms a tool, not paid at start-up for tools never
        called), for every tool however it was made (``dataclasses.replace`` with another ``fn`` included). A
        subclass with its own ``bind`` takes the general path, which calls it. An annotation that says plain data
        while the function returns a model is the function's error: its step fails the output check."""
        if type(self).bind is not Tool.bind:
            return False
        return inspect.iscoroutinefunction(self.fn) and _returns_plain(self.fn)

    def check_args(self, args: Mapping[str, Any], deferred: frozenset[str]) -> list[tuple[str, str]]:
        """Validate literal arguments now; arguments holding references (``deferred``) are checked at call time."""
        if self.args_model is None:
            return []
        problems: list[tuple[str, str]] = []
        try:
            self.args_model.model_validate(dict(args))
        except ValidationError as exc:
            for err in exc.errors():
                loc = [str(p) for p in err["loc"]]
                top = loc[0] if loc else ""
                if top in deferred:
                    continue
                if err["type"] == "extra_forbidden":
                    hint = did_you_mean(top, [f.alias or n for n, f in self.args_model.model_fields.items()])
                    problems.append((top, f"tool '{self.name}' has no argument '{top}'{hint}"))
                elif err["type"] == "missing":
                    problems.append((top, f"required by tool '{self.name}'"))
                else:
                    problems.append((".".join(loc), err["msg"]))
        return problems

    def bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and convert arguments for a call (raises ToolError, not retryable, on bad arguments)."""
        if self.args_model is None:
            return dict(args)
        try:
            model = self.args_model.model_validate(dict(args))
        except ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'args'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolError(f"bad arguments for tool '{self.name}': {details}", kind="arguments",
                            retryable=False) from None
        bound = {(f.alias or name): getattr(model, name) for name, f in self.args_model.model_fields.items()}
        if model.model_extra:
            bound.update(model.model_extra)
        return bound

    def invoke(self, args: Mapping[str, Any]) -> Coroutine[Any, Any, Any]:
        """Call the tool: async functions are awaited, sync ones run in a daemon worker thread, or in a worker
        process when the step says ``isolation: process`` (see :mod:`planweave.tools.isolation`).

        An async function whose output needs no conversion (:attr:`plain_output`) is called here and its own
        coroutine returned: one coroutine less per call, ~2 % of a no-op step (docs/benchmarks.md, "the fields of
        a step"). Bad arguments raise here then, not when the coroutine is awaited.
        """
        if self.plain_output:
            step = current_step_var.get(None)
            if step is None or step.isolation != "process":
                coro: Coroutine[Any, Any, Any] = self.fn(**(dict(args) if self.args_model is None else self.bind(args)))
                return coro
        return self._invoke(args)

    async def _invoke(self, args: Mapping[str, Any]) -> Any:
        kwargs = self.bind(args)
        step = current_step_var.get(None)  # the calling step's context (None outside a step)
        isolation = step.isolation if step is not None else None
        if self.is_async:
            if isolation == "process":
                raise ToolError(f"isolation: process runs synchronous Python functions only; tool '{self.name}' "
                                "is async (it runs on the event loop)", kind="arguments", retryable=False)
            result = await self.fn(**kwargs)
        elif isolation == "process":
            result = await run_in_process(self.fn, kwargs, tool=self.name)
        else:
            result = await run_in_thread(self.fn, **kwargs)
        if type(result) in _PLAIN_OUTPUTS:
            return result  # no isinstance: BaseModel's metaclass is an ABCMeta, whose check is a Python call
        if isinstance(result, BaseModel):
            return result.model_dump(mode="json")
        return result


_PLAIN_OUTPUTS = frozenset({dict, list, str, int, float, bool, type(None)})


def _returns_plain(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s return annotation is plain JSON data (``dict[...]``, ``list[...]``, ``str``, ``None``, ...):
    never a pydantic model, which :meth:`Tool.invoke` dumps. Unknown, ``Any`` or unresolvable: False."""
    try:
        hint = typing.get_type_hints(fn).get("return", Any)
    except Exception:  # a forward reference that does not resolve: assume a model may come back
        return False
    if hint is None:
        return True
    return any((typing.get_origin(hint) or hint) is kind for kind in _PLAIN_OUTPUTS)  # hints need not hash


ToolFunction = Callable[..., Awaitable[Any]] | Callable[..., Any]
F = TypeVar("F", bound=Callable[..., Any])


class Toolbox(Mapping[str, Tool]):
    """A set of tools by name; a :class:`~planweave.core.plan.ToolCatalog` for validation.

    Tools may hold resources (the ``http.*`` tools' connection pool): :meth:`aclose` releases them. The engine
    closes the toolbox it was given when it closes; tools stay usable after that (they open what they need again).
    """

    def __init__(self, tools: Mapping[str, Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = dict(tools or {})
        self._closers: list[Callable[[], Awaitable[None]]] = []

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    # Mapping's own get and __contains__ go through __getitem__ and a KeyError: the plain dict's are one call.
    def get(self, name: str, default: Any = None) -> Any:
        return self._tools.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def add(self, item: Tool | ToolFunction, *, name: str | None = None, idempotent: bool = False,
            cache: CacheOption = None, version: str = "", speculate: bool = True) -> Tool:
        """Add a tool (or a function, wrapped as one); a second tool of the same name is an error."""
        t = item if isinstance(item, Tool) else Tool.from_function(item, name=name, idempotent=idempotent,
                                                                   cache=cache, version=version,
                                                                   speculate=speculate)
        existing = self._tools.get(t.name)
        if existing is not None and existing is not t and existing.fn is not t.fn:
            raise ValueError(f"tool '{t.name}' is already registered")
        self._tools[t.name] = t
        return t

    @overload
    def tool(self, fn: F, /, *, name: str | None = None, idempotent: bool = False, cache: CacheOption = None,
             version: str = "") -> F: ...

    @overload
    def tool(self, fn: None = None, /, *, name: str | None = None, idempotent: bool = False,
             cache: CacheOption = None, version: str = "") -> Callable[[F], F]: ...

    def tool(
        self, fn: F | None = None, /, *, name: str | None = None, idempotent: bool = False,
        cache: CacheOption = None, version: str = "",
    ) -> F | Callable[[F], F]:
        """Decorator registering a function as a tool; the function itself is returned unchanged (and typed so:
        ``@toolbox.tool`` keeps a function's signature under ``mypy --strict``)."""

        def register(f: F) -> F:
            self.add(f, name=name, idempotent=idempotent, cache=cache, version=version)
            return f

        return register(fn) if fn is not None else register

    def merged(self, *others: Mapping[str, Tool]) -> Toolbox:
        """A new toolbox with these tools and those of ``others`` (later ones must not reuse names).

        It also closes what theirs close: closing either releases the same resources.
        """
        out = Toolbox(self._tools)
        out._closers = list(self._closers)
        for other in others:
            for t in other.values():
                out.add(t)
            if isinstance(other, Toolbox):
                out._closers += [c for c in other._closers if c not in out._closers]
        return out

    def without(self, names: Iterable[str]) -> Toolbox:
        """A new toolbox with these tools less ``names``; it closes what this one closes."""
        drop = set(names)
        out = Toolbox({name: t for name, t in self._tools.items() if name not in drop})
        out._closers = list(self._closers)
        return out

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Call ``closer`` when the toolbox is closed (e.g. to close a connection pool its tools share)."""
        self._closers.append(closer)

    async def aclose(self) -> None:
        """Release what the tools hold open; the tools remain usable (they reopen what they need)."""
        for closer in self._closers:
            await closer()


@overload
def tool(fn: ToolFunction, /, *, name: str | None = None, idempotent: bool = False, description: str | None = None,
         cache: CacheOption = None, version: str = "", speculate: bool = True) -> Tool: ...


@overload
def tool(fn: None = None, /, *, name: str | None = None, idempotent: bool = False, description: str | None = None,
         cache: CacheOption = None, version: str = "", speculate: bool = True) -> Callable[[ToolFunction], Tool]: ...


def tool(
    fn: ToolFunction | None = None, /, *, name: str | None = None, idempotent: bool = False,
    description: str | None = None, cache: CacheOption = None, version: str = "", speculate: bool = True,
) -> Tool | Callable[[ToolFunction], Tool]:
    """Decorator turning a function into a :class:`Tool` (add it to a Toolbox, or pass it in ``tools=[...]``).

    ``cache=True`` or ``cache={"ttl": seconds}`` (with ``idempotent=True``): steps calling it reuse the output of an
    earlier call with the same arguments and ``version`` in the journal (docs/caching.md).
    """

    def wrap(f: ToolFunction) -> Tool:
        return Tool.from_function(f, name=name, idempotent=idempotent, description=description, cache=cache,
                                  version=version, speculate=speculate)

    return wrap(fn) if fn is not None else wrap

