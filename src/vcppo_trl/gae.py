"""The advantage contract's import path (`vcppo_trl.gae.dual_lambda_gae`); the functions live in `algo/gae.py`."""

from .algo.gae import dual_lambda_gae, gae, reverse_discounted_cumsum  # noqa: F401
