"""Samples in the shapes trainers read: TRL's ``rollout_func`` return dict, a verl-compatible Parquet layout, slime
``Sample`` fields. One row per model call (parallel steps do not form one linear transcript); each row carries its
episode, run, step, role and policy version so a trainer can group, mask or weight them (docs/rollouts.md).

A sample without token ids (an endpoint that gives none) cannot become a token-level row: the exporters refuse it
naming the episode and call, or leave it out with ``skip_missing=True`` (never re-tokenised here).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from planweave.core.errors import PlanweaveError
from planweave.extras import require
from planweave.rollouts.samples import Sample


class ExportError(PlanweaveError):
    """Samples that cannot be exported as asked; the message names the episode and the call."""


def _usable(samples: Iterable[Sample], skip_missing: bool, what: str) -> list[Sample]:
    out = []
    for s in samples:
        if s.prompt_token_ids is None or s.completion_token_ids is None or s.logprobs is None:
            if skip_missing:
                continue
            why = s.token_ids_missing or "the endpoint returned no logprobs"
            raise ExportError(f"episode {s.episode} call {s.index} ({s.role}{' ' + s.step if s.step else ''}): no "
                              f"token ids or logprobs for {what} ({why}); pass skip_missing=True to leave it out")
        out.append(s)
    return out


def _reward(s: Sample) -> float:
    return 0.0 if s.reward is None else s.reward


def to_trl(samples: Iterable[Sample], *, skip_missing: bool = False) -> dict[str, list[Any]]:
    """TRL's ``rollout_func`` return dict (``GRPOTrainer(rollout_func=...)``, TRL ≥ 0.24): the required
    ``prompt_ids``, ``completion_ids`` and ``logprobs`` (the sampled token's logprob per completion token), one
    entry per call, and extra fields TRL passes to the reward functions as keyword arguments: ``env_reward`` (the
    reward the episode's hook gave this call), ``episode``, ``role``, ``step``, ``policy_version``."""
    rows = _usable(samples, skip_missing, "TRL")
    return {
        "prompt_ids": [list(s.prompt_token_ids or ()) for s in rows],
        "completion_ids": [list(s.completion_token_ids or ()) for s in rows],
        "logprobs": [list(s.logprobs or ()) for s in rows],
        "env_reward": [_reward(s) for s in rows],
        "episode": [s.episode for s in rows],
        "role": [s.role for s in rows],
        "step": [s.step for s in rows],
        "policy_version": [s.policy_version for s in rows],
    }


def to_verl(samples: Iterable[Sample], *, skip_missing: bool = False,
            data_source: str = "planweave") -> list[dict[str, Any]]:
    """Rows with the fields of verl's agent-loop output (``AgentLoopOutput``: ``prompt_ids``, ``response_ids``,
    ``response_mask``, ``response_logprobs``, ``reward_score``, ``num_turns``) plus ``data_source`` and
    ``extra_info`` (episode, run, step, role, plan and policy versions, finish reason): what
    :func:`write_verl_parquet` writes."""
    rows = _usable(samples, skip_missing, "verl")
    return [{
        "data_source": data_source,
        "prompt_ids": list(s.prompt_token_ids or ()),
        "response_ids": list(s.completion_token_ids or ()),
        "response_mask": [1] * len(s.completion_token_ids or ()),
        "response_logprobs": list(s.logprobs or ()),
        "reward_score": _reward(s),
        "num_turns": 2,  # one user turn (the prompt) and one assistant turn (the call's reply)
        "extra_info": {"episode": s.episode, "index": s.index, "run": s.run, "step": s.step, "role": s.role,
                       "plan_version": s.plan_version, "policy_version": s.policy_version,
                       "finish_reason": s.finish_reason, "session": s.session},
    } for s in rows]


def write_verl_parquet(samples: Iterable[Sample], path: str | Path, *, skip_missing: bool = False,
                       data_source: str = "planweave") -> int:
    """Write :func:`to_verl`'s rows to the Parquet file ``path`` (written aside, fsynced, renamed); the row count."""
    require("rollouts", "the verl Parquet export")
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = to_verl(samples, skip_missing=skip_missing, data_source=data_source)
    schema = pa.schema([
        ("data_source", pa.string()), ("prompt_ids", pa.list_(pa.int64())), ("response_ids", pa.list_(pa.int64())),
        ("response_mask", pa.list_(pa.int8())), ("response_logprobs", pa.list_(pa.float64())),
        ("reward_score", pa.float64()), ("num_turns", pa.int32()), ("extra_info", pa.string())])
    table = pa.table({
        "data_source": [r["data_source"] for r in rows], "prompt_ids": [r["prompt_ids"] for r in rows],
        "response_ids": [r["response_ids"] for r in rows], "response_mask": [r["response_mask"] for r in rows],
        "response_logprobs": [r["response_logprobs"] for r in rows],
        "reward_score": [r["reward_score"] for r in rows], "num_turns": [r["num_turns"] for r in rows],
        "extra_info": [json.dumps(r["extra_info"]) for r in rows]}, schema=schema)
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp")
    with temporary.open("wb") as f:
        pq.write_table(table, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, target)
    return len(rows)


def to_slime(samples: Iterable[Sample], *, skip_missing: bool = False) -> list[dict[str, Any]]:
    """Dicts with the fields of slime's ``slime.utils.types.Sample`` (``Sample(**d)`` after turning ``status`` into
    ``Sample.Status(d["status"])``, as its ``from_dict`` does): ``tokens`` is prompt then response ids,
    ``response_length``, ``loss_mask`` (1 per response token), ``rollout_log_probs``, ``weight_versions`` (the
    policy version), ``status`` (``completed``, or ``truncated`` for a reply cut at max_tokens), ``group_index``
    (the episode) and ``metadata`` (run, step, role, plan version, session)."""
    rows = _usable(samples, skip_missing, "slime")
    return [{
        "group_index": s.episode,
        "index": s.index,
        "prompt": [dict(m) for m in s.messages],
        "tokens": list(s.prompt_token_ids or ()) + list(s.completion_token_ids or ()),
        "response": s.text,
        "response_length": len(s.completion_token_ids or ()),
        "label": None,
        "reward": _reward(s),
        "loss_mask": [1] * len(s.completion_token_ids or ()),
        "weight_versions": [str(s.policy_version)],
        "rollout_log_probs": list(s.logprobs or ()),
        "status": "truncated" if s.finish_reason == "length" else "completed",
        "metadata": {"run": s.run, "step": s.step, "role": s.role, "plan_version": s.plan_version,
                     "session": s.session, "finish_reason": s.finish_reason},
    } for s in rows]
