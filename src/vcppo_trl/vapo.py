"""VAPO's import path (`vcppo_trl.vapo`), which checkpoints written before the package's folders pickled in
`training_args.bin`; the config lives in `config/vapo.py`, the trainer in `trainer/vapo.py`."""

from .config.vapo import VAPOConfig  # noqa: F401
from .trainer.vapo import VAPOTrainer  # noqa: F401
