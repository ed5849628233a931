"""Hypothesis profiles. "ci" (the default) keeps the whole suite near a minute on two cores and draws the
same examples every run; `pytest --hypothesis-profile=thorough` (or HYPOTHESIS_PROFILE=thorough) runs many
more, freshly drawn each time."""

import os

from hypothesis import HealthCheck, settings

# Simulations of a few hundred tokens take tens of milliseconds, so no per-example deadline.
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", max_examples=25, derandomize=True, **_COMMON)  # the same examples every run
settings.register_profile("thorough", max_examples=500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))  # --hypothesis-profile overrides this
