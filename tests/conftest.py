"""Test-wide settings: under CI (CI=true) hypothesis runs derandomized, so a CI run is repeatable;
locally it keeps exploring new examples (and `-m slow` runs the heavy sweeps)."""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny cases (opt in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`): on a busy 2-core machine every parallel
    region of a tiny op otherwise waits for a second thread to be scheduled."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
