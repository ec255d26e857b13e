"""One training sample per model call of an episode: where it came from (episode, run, plan version, step, role),
the exact tokens (prompt and completion token ids as the policy server sampled them, the sampled token's logprob
per completion token), the finish reason, the policy version that served it, and the text — plain JSON both ways.

Ids the endpoint did not give are ``None`` with the reason in ``token_ids_missing``; they are never made up by
tokenising the text again behind the trainer's back (docs/rollouts.md, "Exact tokens").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planweave.core.errors import PlanweaveError


class TrajectoryError(PlanweaveError):
    """A stored trajectory or sample (journal, sink) that cannot be read back; the message names the field."""

Role = Literal["planner", "joiner", "step", "other"]
"""Who made the call: the planning loop's planner (plan, re-plan, repair), its joiner, an ``llm`` step, or a caller
planweave did not tag (an unmodified agent driving the gateway)."""

ROLES: tuple[Role, ...] = ("planner", "joiner", "step", "other")


def role_of(purpose: str | None) -> Role:
    """The role of a call from the purpose planweave's client tags it with (``models.admission.CallClass``)."""
    if purpose is None or purpose == "call":
        return "other"
    if purpose == "join":
        return "joiner"
    if purpose in ("llm_step", "subplan"):
        return "step"
    return "planner"  # plan, replan, local_repair, continue, fix_lines, draft, ...


@dataclass(frozen=True, slots=True)
class Sample:
    """One model call of an episode, as a trainer rebuilds a training row from it.

    ``prompt_token_ids``/``completion_token_ids`` are the policy server's own ids (None when it gave none:
    ``token_ids_missing`` says why); ``logprobs`` the sampled token's logprob per completion token (None when not
    returned). ``policy_version`` is the version that served the call (a response header, else the request's, else
    the rollout engine's at call start). ``trainable`` is False for a call kept as context after it fell outside
    the staleness bound; ``reward`` is the episode's reward given to this call (shared, or per call by a hook).
    """

    episode: int
    index: int  # order of the call within the episode (the order the gateway answered them)
    session: str
    run: str | None
    plan_version: int | None
    step: str | None
    role: Role
    messages: tuple[Mapping[str, Any], ...]  # what the caller sent
    text: str
    finish_reason: str | None
    policy_version: int
    prompt_token_ids: tuple[int, ...] | None
    completion_token_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...] | None
    token_ids_missing: str | None = None
    ids_from: str | None = None  # completion ids: "server" (the ids it sampled) or "tokenize-checked" (gateway.Dialect)
    prompt_ids_from: str | None = None  # "server" or "rendered-checked" (gateway.Dialect)
    dialect: str = "vllm"
    reward: float | None = None
    trainable: bool = True
    resampled: int = 0  # times the call was issued again because a policy update left it too old

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens (0 for ids the endpoint did not give)."""
        return len(self.prompt_token_ids or ()) + len(self.completion_token_ids or ())

    def to_json(self) -> dict[str, Any]:
        return {"episode": self.episode, "index": self.index, "session": self.session, "run": self.run,
                "plan_version": self.plan_version, "step": self.step, "role": self.role,
                "messages": [dict(m) for m in self.messages], "text": self.text,
                "finish_reason": self.finish_reason, "policy_version": self.policy_version,
                "prompt_token_ids": _list(self.prompt_token_ids),
                "completion_token_ids": _list(self.completion_token_ids), "logprobs": _list(self.logprobs),
                "token_ids_missing": self.token_ids_missing, "ids_from": self.ids_from,
                "prompt_ids_from": self.prompt_ids_from, "dialect": self.dialect,
                "reward": self.reward, "trainable": self.trainable, "resampled": self.resampled}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "sample") -> Sample:
        if not isinstance(obj, Mapping):
            raise TrajectoryError(f"{where}: not a JSON object")
        try:
            role = str(obj["role"])
            if role not in ROLES:
                raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
            reward = obj.get("reward")
            return cls(
                episode=int(obj["episode"]), index=int(obj["index"]), session=str(obj["session"]),
                run=_opt_str(obj.get("run")), plan_version=_opt_int(obj.get("plan_version")),
                step=_opt_str(obj.get("step")), role=role,
                messages=tuple(dict(m) for m in obj.get("messages") or ()), text=str(obj["text"]),
                finish_reason=_opt_str(obj.get("finish_reason")), policy_version=int(obj["policy_version"]),
                prompt_token_ids=_ints(obj.get("prompt_token_ids")),
                completion_token_ids=_ints(obj.get("completion_token_ids")),
                logprobs=None if obj.get("logprobs") is None else tuple(float(x) for x in obj["logprobs"]),
                token_ids_missing=_opt_str(obj.get("token_ids_missing")),
                ids_from=_opt_str(obj.get("ids_from")), prompt_ids_from=_opt_str(obj.get("prompt_ids_from")),
                dialect=str(obj.get("dialect", "vllm")),
                reward=None if reward is None else float(reward), trainable=bool(obj.get("trainable", True)),
                resampled=int(obj.get("resampled", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise TrajectoryError(f"{where}: not a sample ({type(exc).__name__}: {exc})") from None


def _list(values: Sequence[Any] | None) -> list[Any] | None:
    return None if values is None else list(values)


def _ints(values: Any) -> tuple[int, ...] | None:
    return None if values is None else tuple(int(x) for x in values)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
