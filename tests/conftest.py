"""Shared test configuration: hypothesis profiles.

CI (CI=true) uses a derandomized profile so every run checks the same cases; locally the
default profile draws new examples each run, and hypothesis prints the seed/blob needed to
reproduce any failure (``@reproduce_failure``).
"""

import os

# TensorFlow's oneDNN kernels differ from its reference CPU kernel (the one qlinear.tf matches), and
# the choice is made when TensorFlow is first imported, whichever test does it.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
