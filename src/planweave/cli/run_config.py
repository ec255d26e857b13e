"""The run configuration file (``--config FILE``): the knobs a command line rarely needs, in one checked place.

``planweave run``, ``goal``, ``resume``, ``serve`` and ``worker`` keep the options of every day on the command line
and read the rest from ``--config``: a TOML, YAML or JSON file of flat keys (:class:`RunConfig`; docs/cli.md lists
them), or one ``KEY=VALUE`` pair, the value read as TOML (``priority=2``, ``cache=false``,
``'allow_env=["PATH"]'``) and else taken as text (``prices=prices.yaml``). ``--config`` repeats; a later one wins
key by key, and an option given on the command line wins over them all. Paths in a file are read from the file's
folder. A key that is unknown, of the wrong type, or of no use to the command exits 2 naming the key and where it
was written (``run.toml: key 'priority': ...``).

``resume`` reads the keys it takes and leaves the others to the journal (a run keeps what it started with), so the
``--config`` a run was started with can be given again to resume it, as its ``resume with:`` line does.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from planweave.cli.common import PANEL_OUTPUT, UsageError
from planweave.core.errors import did_you_mean

if TYPE_CHECKING:
    from planweave.models import Endpoint

__all__ = ["COMMAND_KEYS", "ConfigError", "ConfigOption", "LoadedConfig", "RunConfig", "load_config"]

ConfigOption = Annotated[list[str] | None, typer.Option(
    "--config", rich_help_panel=PANEL_OUTPUT, metavar="FILE|KEY=VALUE",
    help="A run configuration file (TOML, YAML or JSON) holding the rarer knobs, or one KEY=VALUE of it "
         "(repeatable, the later wins; an option on the command line wins over both; docs/cli.md).")]


class RunConfig(BaseModel):
    """Every key a run configuration may hold; None (left out): the command's default."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # -- the model endpoint and what its calls may cost
    api_key_env: str | None = Field(None, description="The environment variable holding the endpoint's key "
                                    "(default OPENAI_API_KEY); journaled by name, never the key.")
    headers: list[str] | None = Field(None, description="Extra headers sent to the endpoint, each 'NAME: VALUE'; "
                                      "never journaled nor shown.")
    model_limits: str | None = Field(None, description="A model limits file (docs/admission.md).")
    prices: str | None = Field(None, description="A model prices file (docs/budgets.md, 'Prices').")
    priority: float | None = Field(None, description="The run's priority at shared model endpoints (default 0).")
    tiers: str | None = Field(None, description="A tier table: a plan's model: auto steps are allocated over it "
                              "(docs/allocation.md).")
    cascade: bool | None = Field(None, description="With tiers: model: auto steps, or a goal's planner, cascade "
                                 "over the tiers instead.")
    deadline_pressure: float | None = Field(None, description="Act when the chance to finish by the deadline "
                                            "falls below this (docs/allocation.md).")
    # -- where steps run
    capacities: dict[str, int] | None = Field(None, description="Capacity per resource, e.g. {llm = 4}.")
    executor: Literal["local", "thread", "ray"] | None = Field(None, description="Where tool calls run.")
    ray_address: str | None = Field(None, description="The Ray cluster (host:port; default $RAY_ADDRESS).")
    cache: bool | None = Field(None, description="false: no step reuses a cached output (docs/caching.md).")
    allow_env: list[str] | None = Field(None, description="With --allow-exec: env keys shell steps may set.")
    roots: list[str] | None = Field(None, description="Folders the file.* tools may use (default: the workdir).")
    port: int | None = Field(None, description="The port of --watch's dashboard (default 8765; 0: any free "
                             "port).")
    # -- plan files only (planweave run PLAN)
    speculate: Literal["off", "safe", "eager"] | None = Field(None, description="Speculation mode "
                                                              "(docs/speculation.md).")
    predictor_model: str | None = Field(None, description="The cheap model that predicts running steps' outputs.")
    forecast: bool | None = Field(None, description="Forecast the run as it goes (on with a deadline or budget).")
    # -- goals only (planweave goal)
    plan_max_tokens: int | None = Field(None, description="Most tokens the planner writes per call (default "
                                        "2048).")
    draft_model: str | None = Field(None, description="A small model that drafts the plan ahead of the planner.")
    context: Literal["references", "summary"] | None = Field(None, description="What the planner sees of the run.")
    plan_via: Literal["auto", "tools", "text"] | None = Field(None, description="How the planner writes plans: "
                                                          "add_step tool calls, JSON Lines text, or auto (default).")
    subplans: bool | None = Field(None, description="false: no 'plan' tool (no child runs).")
    memory_model: str | None = Field(None, description="With --memory: the model that distils the run.")
    memory_embed: bool | None = Field(None, description="With --memory: rank entries by embeddings too.")
    # -- planweave serve only
    request_timeout: float | None = Field(None, description="Seconds a client has to send a whole request.")
    max_connections: int | None = Field(None, description="Most connections the server holds at once.")

    @field_validator("priority", "deadline_pressure", "request_timeout")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("plan_max_tokens", "max_connections")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("must be a whole number >= 1")
        return value

    @field_validator("port")
    @classmethod
    def _port(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= 65535:
            raise ValueError("must be a port number, 0 to 65535 (0: any free port)")
        return value

    @field_validator("capacities")
    @classmethod
    def _capacities(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for name, amount in (value or {}).items():
            if amount < 1:
                raise ValueError(f"capacity '{name}' must be a whole number >= 1, got {amount}")
        return value


KEYS = tuple(RunConfig.model_fields)
_SHARED = ("api_key_env", "headers", "model_limits", "prices", "priority", "tiers", "cascade", "deadline_pressure",
           "capacities", "executor", "ray_address", "cache", "allow_env", "roots", "port")
_PLAN_ONLY = ("speculate", "predictor_model", "forecast")
_GOAL_ONLY = ("plan_max_tokens", "draft_model", "context", "plan_via", "subplans", "memory_model",
              "memory_embed")

COMMAND_KEYS: dict[str, tuple[str, ...]] = {
    "run": (*_SHARED, *_PLAN_ONLY),
    "goal": (*_SHARED, *_GOAL_ONLY),
    # a resume takes these; the run's other keys are journaled and kept (see the module's docstring)
    "resume": ("api_key_env", "headers", "model_limits", "tiers", "executor", "ray_address", "cache", "allow_env",
               "roots", "speculate", "predictor_model"),
    "serve": ("api_key_env", "headers", "model_limits", "prices", "allow_env", "roots", "request_timeout",
              "max_connections"),
    "worker": ("api_key_env", "headers", "model_limits", "prices", "allow_env", "roots"),
    "submit": ("prices", "allow_env", "roots"),
    "mcp": ("model_limits", "prices", "allow_env", "roots"),
}
"""The keys each command reads; another command's key exits 2 (``resume`` ignores those it does not take)."""

_PATH_KEYS = ("model_limits", "prices", "tiers")
_OTHER_KIND = {"run": ("goal", "goal runs (planweave goal)"), "goal": ("run", "plan files (planweave run PLAN)")}


class ConfigError(UsageError):
    """A ``--config`` that cannot be used: the message names the key and the file (or the ``KEY=VALUE`` pair)."""


@dataclass(frozen=True)
class LoadedConfig:
    """The merged ``--config`` arguments: the values, where each key was written, and the arguments as given."""

    values: RunConfig = field(default_factory=RunConfig)
    sources: Mapping[str, str] = field(default_factory=dict)
    given: tuple[str, ...] = ()

    def where(self, key: str) -> str:
        """``run.toml: key 'tiers'``: the key and where it was written, for messages."""
        return f"{self.sources.get(key, '--config')}: key '{key}'"

    def resume_args(self) -> list[str]:
        """The ``--config`` arguments a resume repeats: every file, and the pairs but ``headers`` (their values
        are secrets: a resume is given them again)."""
        out: list[str] = []
        for arg in self.given:
            pair = _pair(arg)
            if pair is None or pair[0] != "headers":
                out += ["--config", arg]
        return out


def _pair(arg: str) -> tuple[str, str] | None:
    """``arg`` as a ``KEY=VALUE`` pair naming a known key (None: a file)."""
    key, sep, value = arg.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier() or Path(arg).exists():
        return None
    return key, value.strip()


def _pair_value(text: str) -> Any:
    """A pair's value read as TOML (``2``, ``false``, ``["a"]``, ``{llm = 4}``), else as the text it is."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file (give a .toml, .yaml or .json file, or KEY=VALUE)")
    text = path.read_text(encoding="utf-8")
    data: Any
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    elif path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    elif path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    else:
        raise ConfigError(f"--config {path}: expected a .toml, .yaml, .yml or .json file, or KEY=VALUE")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of keys (KEY = VALUE), got {type(data).__name__}")
    folder = path.parent
    for key in _PATH_KEYS:
        if isinstance(data.get(key), str):
            data[key] = str(folder / data[key])
    if isinstance(data.get("roots"), list):
        data["roots"] = [str(folder / r) if isinstance(r, str) else r for r in data["roots"]]
    return data


def _check(data: Mapping[str, Any], where: str) -> None:
    """Validate ``data`` alone, so an error names the place it was written."""
    try:
        RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            key = ".".join(str(part) for part in error["loc"])
            top = str(error["loc"][0]) if error["loc"] else key
            if error["type"] == "extra_forbidden":
                problems.append(f"{where}: unknown key '{top}'{did_you_mean(top, KEYS)}")
            else:
                given = error.get("input")
                problems.append(f"{where}: key '{key}': {error['msg']} (got {given!r})")
        raise ConfigError("; ".join(problems)) from None


def load_config(args: Sequence[str] | None, command: str) -> LoadedConfig:
    """The ``--config`` arguments of ``command`` read, checked and merged in order (exit 2 naming the key and the
    file for a bad one, or a key of no use to ``command``; ``resume`` ignores those)."""
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for arg in args or ():
        pair = _pair(arg)
        if pair is None:
            data, where = _read_file(Path(arg)), str(arg)
        else:
            data, where = {pair[0]: _pair_value(pair[1])}, f"--config {arg}"
        _check(data, where)
        merged.update(data)
        sources.update(dict.fromkeys(data, where))
    taken = COMMAND_KEYS[command]
    for key in list(merged):
        if key in taken:
            continue
        if command == "resume":
            del merged[key]
            continue
        raise ConfigError(f"{sources[key]}: key '{key}' {_applies_to(key, command)}")
    return LoadedConfig(RunConfig.model_validate(merged), sources, tuple(args or ()))


def _applies_to(key: str, command: str) -> str:
    other, kind = _OTHER_KIND.get(command, ("", ""))
    if other and key in COMMAND_KEYS[other]:
        return f"applies to {kind}, not to planweave {command}"
    users = [name for name, keys in COMMAND_KEYS.items() if key in keys and name != "resume"]
    return f"does not apply to planweave {command} (it applies to: {', '.join(users) or 'none'})"


def keys_of(commands: Iterable[str]) -> list[str]:
    """The keys any of ``commands`` reads, in the schema's order (docs and tests)."""
    wanted = {key for command in commands for key in COMMAND_KEYS[command]}
    return [key for key in KEYS if key in wanted]


def use_config_files(config: LoadedConfig) -> None:
    """Make the config's ``model_limits`` and ``prices`` files the process's (a bad file: exit 2 naming the key)."""
    from planweave.cli.common import use_model_limits
    from planweave.cli.price_flags import use_price_file

    if config.values.model_limits is not None:
        use_model_limits(Path(config.values.model_limits), config.where("model_limits"))
    if config.values.prices is not None:
        use_price_file(Path(config.values.prices), config.where("prices"))


def config_access(config: LoadedConfig) -> Endpoint | None:
    """The config's ``api_key_env`` and ``headers`` as an endpoint without a base URL (None: neither); exit 2 naming
    the key for a bad one."""
    values = config.values
    if values.api_key_env is None and not values.headers:
        return None
    from planweave.models.endpoint import Endpoint, EndpointError, parse_headers

    try:
        return Endpoint(api_key_env=values.api_key_env, headers=parse_headers(values.headers, flag="headers"))
    except EndpointError as exc:
        raise ConfigError(f"{config.where('headers' if exc.field == 'headers' else 'api_key_env')}: {exc}") from None
