"""What a run prints: one compact line per logged update, progress bars without leftovers, warnings once per job.

The full metrics still go to every logging integration (`report_to`) and to `trainer.state.log_history`; only the
console shows the short form.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections.abc import Iterator

from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import ProgressCallback, TrainerCallback

# (label, metric) pairs of the console line, in order; the first present of each group is shown.
_UPDATE_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("objective/scores",)),
    ("acc", ("diagnostics/accuracy",)),
    ("len", ("diagnostics/response_length_mean",)),
    ("done", ("rollout/finished_responses",)),  # generation windows: responses that finished in the update
    ("ev", ("value/explained_variance", "value_pretrain/explained_variance")),
    ("kl", ("kl",)),  # per token, as TRL GRPO logs it (objective/kl: per response)
    ("pg_loss", ("loss/policy_avg",)),
    ("vf_loss", ("loss/value_avg", "value_pretrain/loss_avg")),
    ("clipfrac", ("policy/clipfrac_avg",)),
    ("lr", ("lr",)),
    ("value_lr", ("value_lr",)),
)


# Printed once, the first time a line shows "ev –".
EV_UNDEFINED = (
    "ev –: explained variance is undefined for an update whose returns carry (almost) nothing to explain, e.g. when "
    "every response got the same reward (algo/diagnostics.py explained_variance); the metric is logged as nan."
)


def _number(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "–"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _first_undefined_ev(line: str, seen: list[bool]) -> str:
    """`line`, followed the first time it shows "ev –" by why (`seen` holds whether that was said)."""
    if "  ev –" in line and not seen[0]:
        seen[0] = True
        return line + "\n" + EV_UNDEFINED
    return line


def format_update_line(logs: dict, step: int, max_steps: int) -> str:
    """`update 12/110 [value-pretrain] reward -0.62  acc 0.19  len 94.2  ev 0.31 ...` for one logged update."""
    phase = (
        " value-pretrain" if "value_pretrain/loss_avg" in logs or "value_pretrain/explained_variance" in logs else ""
    )
    parts = [f"update {step}/{max_steps}{phase}:"]
    for label, keys in _UPDATE_FIELDS:
        key = next((k for k in keys if k in logs), None)
        if key is not None and not (phase and label == "lr"):
            parts.append(f"{label} {_number(logs[key])}")
    return "  ".join(parts)


def format_other_line(logs: dict) -> str | None:
    """A short line for logs that are not an update (evaluation, end of training), or `None` to show nothing."""
    if "train_runtime" in logs:
        minutes, seconds = divmod(float(logs["train_runtime"]), 60)
        return f"training finished in {int(minutes)} min {seconds:.0f} s"
    evals = {k: v for k, v in logs.items() if k.startswith("eval_")}
    if evals:
        return "eval: " + "  ".join(f"{k[len('eval_') :]} {_number(v)}" for k, v in evals.items())
    return None  # e.g. value_pretrain/steps (the log says it in words), data/* counts (warned about already)


@contextlib.contextmanager
def no_nested_progress_bars() -> Iterator[None]:
    """
    Hide transformers' and the Hub client's own progress bars (e.g. "Writing model shards") while a training bar is
    on screen: a second bar under it leaves cursor-movement escape codes in logs and notebooks.
    """
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    hub_was_disabled = are_progress_bars_disabled()
    transformers_was_enabled = hf_logging.is_progress_bar_enabled()
    disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not hub_was_disabled:
            enable_progress_bars()
        if transformers_was_enabled:
            hf_logging.enable_progress_bar()


class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(fragment in record.getMessage() for fragment in self.fragments)


def silence_unused_backend_notices() -> None:
    """
    DeepSpeed prints "Setting accelerator to CPU ..." on import when it finds no GPU, and accelerate imports it whenever
    it is installed, used or not. Drop that line unless the run is launched with DeepSpeed.
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        logging.getLogger("DeepSpeed").addFilter(_DropMessages("Setting accelerator to CPU"))


def quiet_replica(process_index: int) -> None:
    """On every process but the first, keep this package's warnings and Python warnings to errors: once per job."""
    if process_index == 0:
        return
    logging.getLogger("vcppo_trl").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


class RolloutProgressCallback(ProgressCallback):
    """
    TRL-style progress bar over updates, with the live reward, accuracy and response length as postfix; one compact
    line per logged update above it; this package's log messages printed above the bar, not through it.
    """

    _ev_said = [False]  # whether "ev –" was explained (once per process: both callbacks share it)

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self._redirect = None
        if self.training_bar is not None:
            self.training_bar.set_description("VC-PPO" if hasattr(args, "lam_actor") else "PPO")
            self._redirect = logging_redirect_tqdm(loggers=[logging.getLogger("vcppo_trl")])
            self._redirect.__enter__()

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)
        if getattr(self, "_redirect", None) is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None

    def on_step_end(self, args, state, control, metrics: dict[str, float] | None = None, **kwargs):
        if self.training_bar is not None and self.training_bar.total != state.max_steps:
            self.training_bar.total = state.max_steps  # value pretraining stopped early: the run shrank, the bar too
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
            pretraining = "value_pretrain/explained_variance" in metrics
            if pretraining:
                postfix["phase"] = "value-pretrain"
            if hasattr(args, "lam_actor"):
                self.training_bar.set_description("value pretraining" if pretraining else "VC-PPO", refresh=False)
            self.training_bar.set_postfix(postfix, refresh=False)

    def on_log(self, args, state, control, logs=None, **kwargs):
        """One compact line per logged update (the full metrics go to `report_to` and `state.log_history`)."""
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        if "episode" in logs:
            line = _first_undefined_ev(format_update_line(logs, state.global_step, state.max_steps), self._ev_said)
        else:
            line = format_other_line(logs)
        if line is not None:
            self.training_bar.write(line)


class CompactPrinterCallback(TrainerCallback):
    """Without progress bars (`disable_tqdm=True`): the same one line per logged update, printed, instead of a dict."""

    _ev_said = RolloutProgressCallback._ev_said

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "episode" in logs:
            line = _first_undefined_ev(format_update_line(logs, state.global_step, state.max_steps), self._ev_said)
        else:
            line = format_other_line(logs)
        if line is not None:
            print(line)
