"""canonical_output's shortcut for an empty dict or list gives exactly what encoding it would (bytes, reference, a
fresh value) and keeps the size limit."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from planweave.journal.base import OutputNotSerialisable, canonical_output, encode_blob


@pytest.mark.parametrize("value", [{}, []])
def test_empty_output_is_encoded_as_json(value: object) -> None:
    blob = canonical_output(value, step="s")
    assert blob.data == orjson.dumps(value)
    assert blob.ref == hashlib.sha256(blob.data).hexdigest() == encode_blob(value)[0]
    assert blob.value == value and type(blob.value) is type(value)
    assert blob.value is not value  # a fresh container, as decoding gives: the tool's own object is not shared
    assert canonical_output(value, step="s").value is not blob.value


@pytest.mark.parametrize("value", [{}, []])
def test_empty_output_over_the_limit_is_refused(value: object) -> None:
    with pytest.raises(OutputNotSerialisable, match="output of step 's' is 2 bytes encoded"):
        canonical_output(value, step="s", limit=1)
    assert canonical_output(value, step="s", limit=2).data in (b"{}", b"[]")


def test_empty_tuple_still_becomes_a_list() -> None:
    blob = canonical_output((), step="s")
    assert blob.data == b"[]" and blob.value == []
