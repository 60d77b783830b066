"""The size field of a PUB line, parsed once per distinct field.

On mixed traffic (many subjects, many sizes) every PUB line is a known subject with a size
seen before, so the fast path reads the size as one dict lookup of the field *with its CR*
(``b"123\\r"``), which also checks the line ends in CRLF: no ``isdigit``, no ``int``, no CR
test per message. A field is validated (ASCII digits only, at most :data:`MAX_DIGITS`) before
it is cached; the cache is bounded. Sans-IO, no Twisted.
"""

from __future__ import annotations

__all__ = ["SIZES", "size_of", "MAX_DIGITS", "SIZES_LIMIT"]

#: longest size field taken by the fast path (anything longer goes the general way)
MAX_DIGITS = 10
#: most distinct size fields remembered (one per size in practice: a few thousand)
SIZES_LIMIT = 16384

#: ``b"<digits>\\r"`` -> its value; only valid fields are ever stored
SIZES: dict[bytes, int] = {}


def size_of(field: bytes) -> int:
    """The value of a size field ending in CR (``b"123\\r"``), or -1 when it is not one.

    Only canonical fields count (no leading zero): the fast path copies the field into the
    ``MSG`` line as it is, and a subscriber must get ``3``, as nats-server writes it, not
    ``03`` (a zero-padded field goes the per-line way, which writes the number anew).
    Valid fields are remembered in :data:`SIZES` (up to :data:`SIZES_LIMIT` of them) so the
    next lookup of the same field is a plain dict hit.
    """
    digits = field[:-1]
    if not 0 < len(digits) <= MAX_DIGITS or field[-1:] != b"\r" or not digits.isdigit() \
            or (digits[0] == 48 and len(digits) > 1):
        return -1
    value = int(digits)
    if len(SIZES) < SIZES_LIMIT:
        SIZES[field] = value
    return value
