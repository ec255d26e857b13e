"""The ``planweave rollouts run CONFIG.yaml`` file: the policy endpoint, the environment, the bound and the sink.

    policy: {base_url: http://127.0.0.1:8000/v1, model: my-policy, api_key_env: OPENAI_API_KEY}
    env: planweave.rollouts.toy:Corridor      # module:callable taking the seed
    episodes: 256
    batch: 64
    max_staleness: 2
    on_stale: partial                          # or drop
    concurrency: 64
    journal: sqlite:///rollouts.db             # optional: resumable
    sink: trajectories.jsonl                   # .jsonl, .parquet (a directory) or redis://host:6379/0#stream
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planweave.core.errors import PlanweaveError
from planweave.rollouts.engine import EnvFactory


class RolloutConfigError(PlanweaveError):
    """A rollouts config that cannot be used; the message names the file and the field."""


class PolicyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base_url: str
    model: str = "policy"
    api_key_env: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: PolicyConfig
    env: str
    episodes: int = Field(ge=1)
    batch: int = Field(default=16, ge=1)
    max_staleness: int = Field(default=1, ge=0)
    on_stale: Literal["partial", "drop"] = "partial"
    concurrency: int = Field(default=16, ge=1)
    max_lag_batches: int = Field(default=2, ge=1)
    max_turns: int = Field(default=32, ge=1)
    seed: int = 0
    system: str | None = None
    journal: str | None = None
    sink: str


def load_config(path: Path) -> RolloutConfig:
    """Read and check ``path``; problems are a :class:`RolloutConfigError` naming the file and each field."""
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RolloutConfigError(f"{path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise RolloutConfigError(f"{path}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise RolloutConfigError(f"{path}: a rollouts config is a mapping (policy, env, episodes, sink, ...)")
    try:
        return RolloutConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise RolloutConfigError(f"{path}: {problems}") from None


def load_env(spec: str, where: str) -> EnvFactory:
    """The ``module:callable`` environment factory ``spec``."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise RolloutConfigError(f"{where}: env {spec!r} is not module:callable (e.g. planweave.rollouts.toy:Corridor)")
    try:
        target = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise RolloutConfigError(f"{where}: env {spec!r} cannot be imported ({exc})") from None
    if not callable(target):
        raise RolloutConfigError(f"{where}: env {spec!r} is not callable")
    factory: EnvFactory = target
    return factory
