"""Token counts and prices: what a model call costs in US dollars, and a token estimate when a server gives none.

A model's price comes from, in order: a price file (``--prices FILE`` or ``$PLANWEAVE_PRICES``: model name → USD
per million input and output tokens), the bundled local model and offline scripts (free), then the maintained
`genai-prices <https://github.com/pydantic/genai-prices>`_ database (OpenAI, Anthropic, Google, Mistral, Groq, ...:
the provider found from the model's name, or named by a ``provider/`` prefix). A price file entry is looked up by
the model's exact name, then by the longest entry its name starts with, so ``my-llama-70b-q4`` is priced as
``my-llama-70b``. A model none of them knows has no price: its cost is unknown (None), never zero, and a dollar
budget refuses it before any call (:func:`require_prices`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

from planweave.core.errors import PlanweaveError
from planweave.models.dialects import PROVIDERS, split_model, wire_name

if TYPE_CHECKING:
    from planweave.models.base import CompletionRequest

CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text with BPE tokenizers
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators a chat template adds per message
PROMPT_MARGIN = 1.25  # the prompt estimate can be low (code, non-English text): reserve this much more
DEFAULT_MAX_TOKENS = 1024

#: The environment variable naming a price file for every price table of the process (``--prices FILE`` wins).
PRICES_ENV = "PLANWEAVE_PRICES"
#: What a refusal tells people to do about a model without a price.
HOW_TO_PRICE = (f"give its price in a file (prices = FILE in a --config, or ${PRICES_ENV}; YAML or JSON: "
                "{MODEL: {input: USD per 1M tokens, output: USD per 1M tokens}})")


def approx_tokens(text: str) -> int:
    """Estimate the number of tokens in ``text`` as one per four characters, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def approx_prompt_tokens(contents: Iterable[str]) -> int:
    """Estimate the prompt tokens of chat messages with these contents, including per-message overhead."""
    return sum(approx_tokens(c) + MESSAGE_OVERHEAD_TOKENS for c in contents) + 2


@dataclass(frozen=True, slots=True)
class Price:
    """USD per one million input (prompt) tokens and per one million output (completion) tokens; ``cached_input``
    per one million prompt tokens read from the provider's cache (None: billed as other input); ``cache_write_input``
    per one million prompt tokens written to it (Anthropic's prompt caching; None: such a call's cost is unknown)."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write_input: float | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
             cache_write_tokens: int = 0) -> float | None:
        """The cost in USD of a call with these token counts (``cached_tokens``: of the prompt's, read from cache;
        ``cache_write_tokens``: written to it), None when it wrote to the cache at no known rate."""
        cached = max(0, min(cached_tokens, prompt_tokens))
        written = max(0, min(cache_write_tokens, prompt_tokens - cached))
        if written and self.cache_write_input is None:
            return None
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return ((prompt_tokens - cached - written) * self.input + cached * cached_rate
                + written * (self.cache_write_input or 0.0) + completion_tokens * self.output) / 1_000_000


FREE = Price(0.0, 0.0)
#: Models that cost nothing: the bundled local model (exactly this name) runs on this machine.
FREE_MODELS = frozenset({"local"})
#: Model name prefixes that cost nothing: offline planning replays a script file (``scripted:FILE``).
FREE_PREFIXES = ("scripted:",)


class UnpricedModels(PlanweaveError):
    """A dollar budget (or a tier table under one) names models without a price: their calls cannot be bounded in
    USD. ``models`` are their names; the message names them and how to give their prices."""

    def __init__(self, message: str, models: Sequence[str]) -> None:
        super().__init__(message)
        self.models = tuple(models)


class PriceTable:
    """Prices by model name; :meth:`lookup` returns None for a model it does not know (its cost is unknown).

    ``PriceTable()`` is the process's table: its price file (:func:`use_prices`, else ``$PLANWEAVE_PRICES``) over
    the free built-ins and the genai-prices database. ``PriceTable(prices)`` holds exactly ``prices`` unless
    ``builtin=True`` adds the built-ins and the database under them.
    """

    def __init__(self, prices: Mapping[str, Price] | None = None, *, builtin: bool | None = None) -> None:
        self._prices: dict[str, Price] = dict(process_prices() if prices is None else prices)
        self._by_length = sorted(self._prices, key=len, reverse=True)
        self._builtin = prices is None if builtin is None else builtin

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base: PriceTable | None = None) -> PriceTable:
        """Prices from ``{"model": {"input": usd_per_1m, "output": usd_per_1m, "cached_input"?: usd_per_1m}}``,
        added over ``base`` (the process's table).

        Raises ValueError naming the model whose entry is not two (or three) non-negative numbers.
        """
        start = base or cls()
        return cls({**start._prices, **parse_prices(data)}, builtin=start._builtin)

    @classmethod
    def load(cls, path: str | Path, *, base: PriceTable | None = None) -> PriceTable:
        """Prices from a JSON or YAML file (:func:`read_price_file`), added over ``base`` (the process's table)."""
        start = base or cls()
        return cls({**start._prices, **read_price_file(path)}, builtin=start._builtin)

    def merged(self, prices: Mapping[str, Price]) -> PriceTable:
        """A new table with these prices added (replacing entries of the same name)."""
        return PriceTable({**self._prices, **prices}, builtin=self._builtin)

    def _entry(self, model: str) -> Price | None:
        for name in dict.fromkeys((model, wire_name(model))):  # ``anthropic:claude-x``, then ``claude-x``
            exact = self._prices.get(name)
            if exact is not None:
                return exact
            for key in self._by_length:
                if name.startswith(key):
                    return self._prices[key]
        if self._builtin and (model in FREE_MODELS or model.startswith(FREE_PREFIXES)):
            return FREE
        return None

    def lookup(self, model: str) -> Price | None:
        """The price of ``model``: its exact entry, else the longest entry its name starts with, else the free
        built-ins, else the database's (its base rates where the price is tiered by prompt length), else None."""
        entry = self._entry(model)
        if entry is not None or not self._builtin:
            return entry
        found = _database_model(model)
        return None if found is None else found[0]

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, *,
             cache_write_tokens: int = 0) -> float | None:
        """The cost in USD of a call to ``model`` (``cached_tokens`` of its prompt read from the provider's cache,
        ``cache_write_tokens`` written to it), or None if the table has no price for it (or for its cache writes).
        The database's prices are computed by genai-prices (prompt-length tiers and cache rates included)."""
        entry = self._entry(model)
        if entry is not None:
            return entry.cost(prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens)
        if not self._builtin:
            return None
        return _database_cost(model, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens)

    def source(self, model: str) -> str | None:
        """Where the price of ``model`` comes from: ``"table"`` (a price file or the entries given), ``"free"``,
        ``"genai-prices"`` (with the provider: ``"genai-prices:openai"``), or None (no price)."""
        if model in self._prices or any(model.startswith(k) for k in self._by_length):
            return "table"
        if self._entry(model) is not None:
            return "free"
        if not self._builtin:
            return None
        found = _database_model(model)
        return None if found is None else f"genai-prices:{found[1]}"

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.lookup(model) is not None


# -- the price file -------------------------------------------------------------------------------------------------
def parse_prices(data: Mapping[str, Any], where: str = "price") -> dict[str, Price]:
    """Prices from ``{"model": {"input": usd_per_1m, "output": usd_per_1m, "cached_input"?: usd_per_1m}}``.

    Raises ValueError naming the model whose entry is not two (or three) finite non-negative numbers.
    """
    prices: dict[str, Price] = {}
    for name, entry in data.items():
        shape = (f"{where} of model '{name}' must be {{input: USD per 1M tokens, output: USD per 1M tokens, "
                 f"cached_input?: USD per 1M tokens, cache_write_input?: USD per 1M tokens}}, got {entry!r}")
        if not isinstance(entry, Mapping) or set(entry) - {"input", "output", "cached_input", "cache_write_input"}:
            raise ValueError(shape)
        try:
            cached, written = entry.get("cached_input"), entry.get("cache_write_input")
            price = Price(_usd(entry["input"]), _usd(entry["output"]), None if cached is None else _usd(cached),
                          None if written is None else _usd(written))
        except (TypeError, KeyError, ValueError):
            raise ValueError(shape) from None
        if min(price.input, price.output, price.cached_input or 0.0, price.cache_write_input or 0.0) < 0:
            raise ValueError(f"{where} of model '{name}' must not be negative, got {entry!r}")
        prices[str(name)] = price
    return prices


def _usd(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(value)
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(value)
    return number


def read_price_file(path: str | Path) -> dict[str, Price]:
    """The prices in a JSON or YAML file (by suffix; YAML otherwise) mapping model names to prices.

    Raises ValueError naming the file (and the model) for anything unreadable or wrong.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"price file {p}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"price file {p} is not valid: {exc}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"price file {p} must map model names to prices, got {type(data).__name__}")
    return parse_prices(data, where=f"price file {p}: the price")


_PROCESS_PRICES: list[dict[str, Price]] = []  # the process's price file, once read


def use_prices(path: str | Path | None) -> None:
    """Make the prices in ``path`` (None: none) the process's price file, which every ``PriceTable()`` made from
    now on puts over the database. Raises ValueError for a bad file (and keeps the previous prices)."""
    prices = {} if path is None else read_price_file(path)
    _PROCESS_PRICES[:] = [prices]


def process_prices() -> Mapping[str, Price]:
    """The process's price file: the one :func:`use_prices` set, else ``$PLANWEAVE_PRICES``'s (read once; a bad
    file raises ValueError naming the variable), else none."""
    if not _PROCESS_PRICES:
        path = os.environ.get(PRICES_ENV)
        try:
            _PROCESS_PRICES[:] = [read_price_file(path) if path else {}]
        except ValueError as exc:
            raise ValueError(f"${PRICES_ENV}: {exc}") from None
    return _PROCESS_PRICES[0]


# -- the genai-prices database --------------------------------------------------------------------------------------
def _find(model: str) -> Any:
    """genai-prices' (provider, model info) for ``model``, or None: by its name alone (the database finds the
    provider: ``gpt-*`` OpenAI, ``claude-*`` Anthropic, ``gemini-*`` Google, ...), else as ``provider/name``."""
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    dialect, bare = split_model(model)  # ``anthropic:claude-x``: claude-x at Anthropic
    tries: list[tuple[str, str | None]] = [(bare, None)]
    if bare != model:
        tries.insert(0, (bare, PROVIDERS[dialect]))
    model = bare
    if "/" in model:
        provider, _, name = model.partition("/")
        tries.append((name, provider))
    for ref, provider_id in tries:
        try:
            return snapshot.find_provider_model(ref, None, provider_id, None)
        except LookupError:
            continue
    return None


@cache
def _database_model(model: str) -> tuple[Price, str] | None:
    """The database's price of ``model`` (base rates of tiered prices) and its provider's id, or None."""
    found = _find(model)
    if found is None:
        return None
    provider, info = found
    from datetime import UTC, datetime

    rates = info.get_prices(datetime.now(tz=UTC))

    def rate(name: str) -> float | None:
        value = getattr(rates, name, None)
        value = getattr(value, "base", value)  # TieredPrices: the rate below the first tier
        return None if value is None else float(value)

    input_rate, output_rate = rate("input_mtok"), rate("output_mtok")
    if input_rate is None or output_rate is None:  # priced per request, image, second...: not a token price
        return None
    return Price(input_rate, output_rate, rate("cache_read_mtok"), rate("cache_write_mtok")), str(provider.id)


def _database_cost(model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
                   cache_write_tokens: int = 0) -> float | None:
    found = _database_model(model)
    if found is None:
        return None
    cached = max(0, min(cached_tokens, prompt_tokens))
    written = max(0, min(cache_write_tokens, prompt_tokens - cached))
    if written and found[0].cache_write_input is None:
        return None  # a cache write at no known rate: unknown, not the input rate
    from genai_prices import Usage

    provider, info = _find(model)
    usage = Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens,
                  cache_read_tokens=cached or None, cache_write_tokens=written or None)
    return float(info.calc_price(usage, provider).total_price)


# -- refusing what a dollar budget cannot bound ---------------------------------------------------------------------
def unpriced(models: Iterable[str], prices: PriceTable | None = None) -> list[str]:
    """The names among ``models`` that ``prices`` (default the process's table) has no price for, each once."""
    table = prices if prices is not None else PriceTable()
    return [m for m in dict.fromkeys(models) if m not in table]


def require_prices(models: Iterable[str], budget_usd: float | None, prices: PriceTable | None = None, *,
                   budget: str = "--budget-usd", how: str = HOW_TO_PRICE) -> None:
    """With a dollar budget (``budget_usd`` not None), refuse models without a price before any of them is called:
    their calls would be counted as free and the budget would bound nothing. Raises :class:`UnpricedModels`
    naming each model, the budget (``budget``: the flag or field that set it) and ``how`` to give a price; a token
    budget needs no price."""
    if budget_usd is None:
        return
    missing = unpriced(models, prices)
    if not missing:
        return
    names = ", ".join(f"'{m}'" for m in missing)
    plural = "s" if len(missing) > 1 else ""
    raise UnpricedModels(
        f"model{plural} {names} ha{'ve' if plural else 's'} no known price, so {budget} cannot bound "
        f"{'their' if plural else 'its'} calls (they would be counted as free): {how}, or use a token budget "
        "instead", missing)


def calls_llm(steps: Iterable[Any], tool: str = "llm") -> bool:
    """Whether any of a plan's ``steps`` calls a model: its tool or its fallback's is ``tool`` (the ``llm`` tool)."""
    return any(step.tool == tool or (step.fallback is not None and step.fallback.tool == tool) for step in steps)


def unpriced_calls(calls: Iterable[Mapping[str, Any]], prices: PriceTable | None = None) -> list[str]:
    """The models of journaled ``model_call`` data billed nothing for tokens they used because the model has no
    price (default: the process's table), each once: the run's cost is unknown, not the sum it shows."""
    candidates = [str(c["model"]) for c in calls
                  if c.get("model") and not c.get("cost_usd")
                  and int(c.get("prompt_tokens", 0) or 0) + int(c.get("completion_tokens", 0) or 0) > 0]
    return unpriced(candidates, prices) if candidates else []


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
