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

Goal-run episodes through the rollout gateway (docs/rollouts.md) take ``episodes_from`` instead of ``env``:

    policy: {base_url: http://127.0.0.1:8000/v1, api_key_env: VLLM_KEY}   # the policy server (the upstream)
    gateway: {dialect: vllm}                   # or llama-cpp-python (chat_format: gemma), openai
    episodes_from: my_tasks:episode            # module:callable, seed -> rollouts.goals.EpisodeSpec
    reward: my_tasks:score                     # optional: module:callable, EpisodeOutcome -> float or one per call
    episodes: 256
    ...
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


class GatewayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dialect: Literal["vllm", "llama-cpp-python", "openai"] = "vllm"
    chat_format: Literal["gemma"] | None = None


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: PolicyConfig
    env: str | None = None
    episodes_from: str | None = None
    reward: str | None = None
    gateway: GatewayConfig | None = None
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
        config = RolloutConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise RolloutConfigError(f"{path}: {problems}") from None
    if (config.env is None) == (config.episodes_from is None):
        raise RolloutConfigError(f"{path}: give env (reset/step environments) or episodes_from (goal-run episodes "
                                 f"through the gateway), exactly one")
    if config.env is not None and (config.gateway is not None or config.reward is not None):
        raise RolloutConfigError(f"{path}: gateway and reward go with episodes_from, not env (an environment's "
                                 f"rewards are its own)")
    return config


def load_callable(spec: str, where: str, field: str = "env",
                  example: str = "planweave.rollouts.toy:Corridor") -> Any:
    """The ``module:callable`` named by config field ``field``; a :class:`RolloutConfigError` naming it if not."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise RolloutConfigError(f"{where}: {field} {spec!r} is not module:callable (e.g. {example})")
    try:
        target = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise RolloutConfigError(f"{where}: {field} {spec!r} cannot be imported ({exc})") from None
    if not callable(target):
        raise RolloutConfigError(f"{where}: {field} {spec!r} is not callable")
    return target


def load_env(spec: str, where: str) -> EnvFactory:
    """The ``module:callable`` environment factory ``spec``."""
    factory: EnvFactory = load_callable(spec, where)
    return factory
