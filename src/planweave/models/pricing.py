"""Token counts and prices: what a model call costs in US dollars, and a token estimate when a server gives none.

The price table maps a model name to USD per million input and output tokens. A model is looked up by its exact
name, then by the longest table key its name starts with, so ``gpt-4o-mini-2024-07-18`` (the name OpenAI answers
with) is priced as ``gpt-4o-mini``. The built-in prices are list prices of a few well-known models and go stale:
override them with :meth:`PriceTable.load` (a JSON or YAML file) or :meth:`PriceTable.merged`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

if TYPE_CHECKING:
    from planweave.models.base import CompletionRequest

CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text with BPE tokenizers
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators a chat template adds per message
PROMPT_MARGIN = 1.25  # the prompt estimate can be low (code, non-English text): reserve this much more
DEFAULT_MAX_TOKENS = 1024


def approx_tokens(text: str) -> int:
    """Estimate the number of tokens in ``text`` as one per four characters, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def approx_prompt_tokens(contents: Iterable[str]) -> int:
    """Estimate the prompt tokens of chat messages with these contents, including per-message overhead."""
    return sum(approx_tokens(c) + MESSAGE_OVERHEAD_TOKENS for c in contents) + 2


@dataclass(frozen=True, slots=True)
class Price:
    """USD per one million input (prompt) tokens and per one million output (completion) tokens."""

    input: float
    output: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """The cost in USD of a call with these token counts."""
        return (prompt_tokens * self.input + completion_tokens * self.output) / 1_000_000


DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.40),
    "o3": Price(2.00, 8.00),
    "o3-mini": Price(1.10, 4.40),
    "o4-mini": Price(1.10, 4.40),
    "gpt-3.5-turbo": Price(0.50, 1.50),
    "local": Price(0.0, 0.0),
}


class PriceTable:
    """Prices by model name; :meth:`lookup` returns None for a model it does not know (its cost is unknown)."""

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        self._prices: dict[str, Price] = dict(DEFAULT_PRICES if prices is None else prices)
        self._by_length = sorted(self._prices, key=len, reverse=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base: PriceTable | None = None) -> PriceTable:
        """Prices from ``{"model": {"input": usd_per_1m, "output": usd_per_1m}}``, added over ``base`` (the defaults).

        Raises ValueError naming the model whose entry is not two non-negative numbers.
        """
        prices = dict((base or cls())._prices)
        for name, entry in data.items():
            try:
                price = Price(float(entry["input"]), float(entry["output"]))
            except (TypeError, KeyError, ValueError):
                raise ValueError(
                    f"price of model '{name}' must be {{input: USD per 1M tokens, output: USD per 1M tokens}}, "
                    f"got {entry!r}"
                ) from None
            if price.input < 0 or price.output < 0:
                raise ValueError(f"price of model '{name}' must not be negative, got {entry!r}")
            prices[str(name)] = price
        return cls(prices)

    @classmethod
    def load(cls, path: str | Path, *, base: PriceTable | None = None) -> PriceTable:
        """Prices from a JSON or YAML file (by suffix; YAML otherwise), added over ``base`` (the defaults)."""
        p = Path(path)
        text = p.read_text(encoding="utf-8")
        try:
            data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ValueError(f"price file {p} is not valid: {exc}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"price file {p} must map model names to prices, got {type(data).__name__}")
        return cls.from_mapping(data, base=base)

    def merged(self, prices: Mapping[str, Price]) -> PriceTable:
        """A new table with these prices added (replacing entries of the same name)."""
        return PriceTable({**self._prices, **prices})

    def lookup(self, model: str) -> Price | None:
        """The price of ``model``: its exact entry, else the longest entry its name starts with, else None."""
        exact = self._prices.get(model)
        if exact is not None:
            return exact
        for key in self._by_length:
            if model.startswith(key):
                return self._prices[key]
        return None

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
        """The cost in USD of a call to ``model``, or None if the table has no price for it."""
        price = self.lookup(model)
        return None if price is None else price.cost(prompt_tokens, completion_tokens)

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.lookup(model) is not None


def worst_case(
    request: CompletionRequest,
    model: str,
    prices: PriceTable,
    *,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
) -> tuple[float | None, int]:
    """The most a call can cost, to reserve from a budget before it starts: (USD, or None if ``model`` has no price;
    tokens), from the prompt estimate with :data:`PROMPT_MARGIN` plus ``max_tokens`` (or ``default_max_tokens``)."""
    contents = [m.content for m in request.messages]
    if request.schema is not None:
        contents.append(orjson.dumps(dict(request.schema)).decode())  # the schema may be added to the prompt
    prompt_tokens = math.ceil(approx_prompt_tokens(contents) * PROMPT_MARGIN)
    max_tokens = request.max_tokens or default_max_tokens
    return prices.cost(model, prompt_tokens, max_tokens), prompt_tokens + max_tokens
