"""Examples (run from the repository root): `python examples/quantize_and_compare.py`, and
`qbackend compare examples.digits_case:case`."""
