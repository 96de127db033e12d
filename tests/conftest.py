"""Shared test configuration: hypothesis profiles.

CI (CI=true) uses a derandomized profile so every run checks the same cases; locally the
default profile draws new examples each run, and hypothesis prints the seed/blob needed to
reproduce any failure (``@reproduce_failure``).
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev")
