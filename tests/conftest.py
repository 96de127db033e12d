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

import pytest
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


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="run the full suite: every integer GEMM path of this CPU, the full randomized budgets and the "
                     "probes that compile every kernel from scratch (about 30 minutes on 2 cores); also QLINEAR_FULL_TESTS=1")


def pytest_configure(config):
    config.addinivalue_line("markers", "full: runs only in the full suite (--full or QLINEAR_FULL_TESTS=1)")
    if config.getoption("--full"):
        os.environ["QLINEAR_FULL_TESTS"] = "1"  # before tests/suite.py is imported by any test module


def pytest_collection_modifyitems(config, items):
    import suite

    if suite.FULL:
        return
    skip = pytest.mark.skip(reason="in the full suite only: uv run pytest --full")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)
