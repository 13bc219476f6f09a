"""Settings shared by every test: Hypothesis profiles sized for CI, and where compiled
fusion kernels go."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=15, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config) -> None:
    # Fused kernels compiled by the tests go to one folder of this run, shared by the xdist
    # workers (they inherit the variable), never to the user's cache.
    if "EMBER_FUSION_CACHE" not in os.environ:
        import tempfile

        os.environ["EMBER_FUSION_CACHE"] = tempfile.mkdtemp(prefix="ember-fusion-kernels-")
    # Writing each explored plan to disk costs an fsync; tests/backends/fusion/
    # test_fusion_plans.py turns the store on where it is under test.
    os.environ.setdefault("EMBER_FUSION_PLANS", "0")
