"""Test-wide settings: under CI (CI=true) hypothesis runs derandomized, so a CI run is repeatable;
locally it keeps exploring new examples (and `-m slow` runs the heavy sweeps)."""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
