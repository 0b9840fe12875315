"""Progress display of the base trainer: a TRL-style progress bar over updates, or one printed line per update."""

from __future__ import annotations

import logging as std_logging
import math

from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import ProgressCallback, TrainerCallback

from .output import format_other_line, format_update_line


class RolloutProgressCallback(ProgressCallback):
    """
    TRL-style progress bar over updates, with the live reward, accuracy and response length as postfix; one compact
    line per logged update above it; this package's log messages printed above the bar, not through it.
    """

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self._redirect = None
        if self.training_bar is not None:
            self.training_bar.set_description("VC-PPO" if hasattr(args, "lam_actor") else "PPO")
            self._redirect = logging_redirect_tqdm(loggers=[std_logging.getLogger("vcppo_trl")])
            self._redirect.__enter__()

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)
        if getattr(self, "_redirect", None) is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None

    def on_step_end(self, args, state, control, metrics: dict[str, float] | None = None, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        if state.is_world_process_zero and self.training_bar is not None and metrics:
            postfix = {}
            for label, key in (
                ("reward", "objective/scores"),
                ("acc", "diagnostics/accuracy"),
                ("len", "diagnostics/response_length_mean"),
                ("ev", "value/explained_variance"),
                ("ev", "value_pretrain/explained_variance"),
            ):
                if key in metrics and not math.isnan(metrics[key]):
                    postfix[label] = f"{metrics[key]:.3g}"
            if "value_pretrain/explained_variance" in metrics:
                postfix["phase"] = "value-pretrain"
            self.training_bar.set_postfix(postfix, refresh=False)

    def on_log(self, args, state, control, logs=None, **kwargs):
        """One compact line per logged update (the full metrics go to `report_to` and `state.log_history`)."""
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        if "episode" in logs:
            line = format_update_line(logs, state.global_step, state.max_steps)
        else:
            line = format_other_line(logs)
        if line is not None:
            self.training_bar.write(line)


class CompactPrinterCallback(TrainerCallback):
    """Without progress bars (`disable_tqdm=True`): the same one line per logged update, printed, instead of a dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "episode" in logs:
            line = format_update_line(logs, state.global_step, state.max_steps)
        else:
            line = format_other_line(logs)
        if line is not None:
            print(line)
