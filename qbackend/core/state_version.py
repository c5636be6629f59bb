"""The format-version field of stored state (packed weights, embedding tables, records, observer
state): a value that is not an int is a malformed state, told apart from a version this qbackend
does not read. `bool` is an int subclass and `1.0 == 1`: neither is a version."""
from __future__ import annotations


def check_state_version(value, supported: tuple[int, ...], what: str, field: str = "format_version") -> int:
    """`value` if it is one of the `supported` versions; else a ValueError naming `what` (the
    state) and `field`: malformed (with the value's type) for a non-int, unsupported otherwise."""
    if type(value) is not int:
        got = "no value" if value is None else f"{value!r} ({type(value).__name__})"
        raise ValueError(f"{what} is malformed: its {field!r} field must be an int, got {got}")
    if value not in supported:
        reads = " or ".join(str(v) for v in supported)
        raise ValueError(f"{what} has {field} {value}; this qbackend reads version {reads}")
    return value
