"""The store's headers JSON is exactly what ``json.dumps`` with compact separators gives."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mqhub.store.codec import decode_meta, encode_meta, headers_json
from mqhub.testing import property_examples

values = st.one_of(st.text(), st.integers(), st.none(), st.booleans())


@settings(max_examples=property_examples(300), deadline=None)
@given(st.dictionaries(st.text(), values, max_size=5))
def test_headers_json_matches_json_dumps(headers: dict) -> None:  # type: ignore[type-arg]
    """Same text for str values (fast path) and anything else (fallback); meta round-trips."""
    assert headers_json(headers) == json.dumps(headers, separators=(",", ":"))
    if headers:
        assert decode_meta(encode_meta("a.b", headers, "o")) == ("a.b", headers, "o")
