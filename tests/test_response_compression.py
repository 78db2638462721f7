"""Response compression: any body round-trips, and sizing zlib's window to the body costs no compression."""

from __future__ import annotations

import gzip
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.http.body import compress

BODIES = st.one_of(st.binary(max_size=2048), st.binary(min_size=1, max_size=64).map(lambda b: b * 3000))


@settings(max_examples=200, deadline=None)
@given(body=BODIES)
def test_any_body_round_trips_no_larger_than_zlibs_default(body):
    gzipped, encoding = compress(body, "br;q=1.0, gzip;q=0.8")
    assert encoding == "gzip" and gzip.decompress(gzipped) == body
    deflated, encoding = compress(body, "deflate")
    assert encoding == "deflate" and zlib.decompress(deflated) == body
    assert len(deflated) <= len(zlib.compress(body, 6))  # the full 32 KiB window does no better


def test_nothing_accepted_leaves_the_body_alone():
    assert compress(b"body", "") == (b"body", None)
    assert compress(b"body", "br, identity") == (b"body", None)
