"""A control policy over a model (an OpenAI-compatible endpoint, a local one): each chunk is one completion whose
JSON reply lists the next actions — language-level plans as chunks.

The model is asked for ``{"actions": [...]}`` (a JSON schema, so the reply is checked), told the observation (as
``describe(obs)`` renders it), the tick the first action is for and how many actions to give. A reply with too few
or too many actions, or none, is a :class:`~planweave.control.loop.ControlError` naming the chunk.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any

from planweave.control.loop import ChunkRequest, ControlError
from planweave.control.realign import Action, Observation
from planweave.models.base import CompletionRequest, Message, ModelClient
from planweave.models.errors import ModelError

SYSTEM = ("You control a system in real time. Reply with JSON: {\"actions\": [...]}, the next actions in order, one "
          "per control tick, each as the action schema says.")


def describe_json(obs: Observation) -> str:
    """The observation as JSON (dataclasses as their fields)."""
    value = asdict(obs) if is_dataclass(obs) and not isinstance(obs, type) else obs
    return json.dumps(value, sort_keys=True, default=str)


class ModelPolicy:
    """Ask ``client`` for each chunk; ``action_schema`` is the JSON schema of one action."""

    def __init__(self, client: ModelClient, *, action_schema: Mapping[str, Any], task: str = "",
                 describe: Callable[[Observation], str] = describe_json, model: str | None = None,
                 max_tokens: int = 1024, parse: Callable[[Any], Action] | None = None) -> None:
        self.client, self.action_schema, self.task, self.describe = client, action_schema, task, describe
        self.model, self.max_tokens, self.parse = model, max_tokens, parse
        self.calls = 0
        self.cost_usd = 0.0

    async def __call__(self, request: ChunkRequest) -> Sequence[Action]:
        schema = {"type": "object", "required": ["actions"], "additionalProperties": False,
                  "properties": {"actions": {"type": "array", "minItems": 1, "maxItems": request.horizon,
                                             "items": dict(self.action_schema)}}}
        prompt = (f"{self.task}\nObservation (for tick {request.start_tick}, {request.dt:g} s per tick): "
                  f"{self.describe(request.obs)}\nGive up to {request.horizon} actions, the first for tick "
                  f"{request.start_tick}.").strip()
        self.calls += 1
        try:
            completion = await self.client.complete(CompletionRequest(
                (Message("system", SYSTEM), Message("user", prompt)), model=self.model, max_tokens=self.max_tokens,
                schema=schema, schema_name="chunk"))
        except ModelError as exc:
            raise ControlError(f"the model policy failed on chunk {request.chunk}: {exc}") from None
        self.cost_usd += completion.cost_usd or 0.0
        parsed = completion.parsed
        actions = parsed.get("actions") if isinstance(parsed, dict) else None
        if not isinstance(actions, list) or not actions:
            raise ControlError(f"the model policy's reply for chunk {request.chunk} holds no actions: "
                               f"{completion.text[:200]!r}")
        if len(actions) > request.horizon:
            raise ControlError(f"the model policy's reply for chunk {request.chunk} has {len(actions)} actions, "
                               f"more than the horizon of {request.horizon}")
        return [self.parse(a) if self.parse is not None else (tuple(a) if isinstance(a, list) else a)
                for a in actions]
