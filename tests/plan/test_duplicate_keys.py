"""A key given twice in one object is refused wherever plans are read as JSON: plan files (test_planfile_limits),
posted plans (tests/server/test_plan_yaml_limits) and the planner's streamed step lines, here."""

from __future__ import annotations

import json

import pytest

from planweave.core.plan.document import DuplicateKey, unique_keys
from planweave.planning.lines import LineParser


def test_unique_keys_names_the_key_given_twice() -> None:
    assert json.loads('{"a": 1, "b": {"a": 2}}', object_pairs_hook=unique_keys) == {"a": 1, "b": {"a": 2}}
    with pytest.raises(DuplicateKey) as raised:
        json.loads('{"steps": [{"id": "a", "tool": "noop", "id": "b"}]}', object_pairs_hook=unique_keys)
    assert raised.value.key == "id"
    assert "the key 'id' is given twice in one object" in str(raised.value)


@pytest.mark.parametrize("line", [
    '{"id": "a", "tool": "noop", "id": "b"}',
    '[{"id": "a", "tool": "noop"}, {"id": "c", "tool": "noop", "args": {"x": 1, "x": 2}}]',
])
def test_a_planner_step_line_giving_a_key_twice_is_an_error_line_not_a_step(line: str) -> None:
    parser = LineParser()
    (parsed,) = [*parser.feed("{\"id\": \"ok\", \"tool\": \"noop\"}\n" + line + "\n"), *parser.close()][1:]
    assert parsed.steps == ()
    assert parsed.error is not None
    assert parsed.error.startswith("line 2: the key ")
    assert "is given twice in one object" in parsed.error
