"""Reading a tier table from a file (YAML or JSON): ``planweave run plan.yaml --model M --tiers tiers.yaml``."""

from __future__ import annotations

from pathlib import Path

from planweave.allocate.model import AllocationError, TierTable


def load_tiers(path: str | Path) -> TierTable:
    """The tier table in ``path``: ``{name: {model, p_success, duration_s, cost_usd, duration_sigma?, tokens?}}``.

    Raises :class:`AllocationError` naming the file (and the tier and field) for anything unreadable or wrong.
    """
    import yaml

    where = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise AllocationError(f"tiers file {where}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise AllocationError(f"tiers file {where}: not YAML or JSON ({exc})") from None
    return TierTable.from_mapping(data, where=f"tiers file {where}")
