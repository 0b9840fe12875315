"""The value-pretraining callback's import path (`vcppo_trl.callbacks.ValuePretrainCallback`); the phase, its stop rule
and the callback live in `trainer/value_pretraining.py`."""

from .trainer.value_pretraining import ValuePretrainCallback  # noqa: F401
