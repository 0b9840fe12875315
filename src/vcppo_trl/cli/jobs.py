"""The three jobs `train.py` runs on a built trainer: storing rollouts (`--store_rollouts`), pretraining a critic alone
(`value_pretrain_only`) or training (the default). Each prints its summary on the main process; the caller then leaves
the process group ([`~cli.process_exit.leave_process_group`]), except after a stop by signal, which leaves it here."""

from __future__ import annotations

import logging

from ..config import VCPPOConfig
from ..trainer import TrainingInterrupted, VCPPOTrainer, store_rollouts
from .arguments import VCPPOScriptArguments
from .process_exit import leave_process_group

logger = logging.getLogger(__name__)


def store_rollouts_job(trainer: VCPPOTrainer, script_args: VCPPOScriptArguments) -> None:
    """Sample the initial policy on value pretraining's prompt batches, score them and write them to the
    `--store_rollouts` folder ([`~trainer.store_job.store_rollouts`]); nothing is trained."""
    report = store_rollouts(
        trainer,
        script_args.store_rollouts,
        num_batches=script_args.store_rollouts_batches,
        push_to_hub=script_args.store_rollouts_push_to_hub,
    )
    if trainer.is_world_process_zero():
        print(
            f"\nStored rollouts in {report.path}: {report.complete_batches} complete batches "
            f"({report.batches_written} written now, {report.batches_found} found written) in {report.seconds:.0f} s"
            + (f"; pushed to {report.hub_url}" if report.hub_url else "")
        )


def critic_job(trainer: VCPPOTrainer, training_args: VCPPOConfig) -> None:
    """Value pretraining alone: no evaluation, no policy saved; the critic's folder is printed."""
    train_or_exit(trainer, resume_target(training_args.resume_from_checkpoint))
    if trainer.is_world_process_zero():
        print(
            f"\nPretrained critic: {trainer.value_pretrain_callback.saved_paths[-1]} (load it with --value_model_path)"
        )


def training_job(
    trainer: VCPPOTrainer, training_args: VCPPOConfig, *, evaluate: bool, toy: bool, dataset_name: str | None
) -> None:
    """Train, then save the policy (and critic) or push them to the Hub. With held-out data (`evaluate`), the policy
    is evaluated before (unless resumed) and after, and the two printed as a table."""
    resume = resume_target(training_args.resume_from_checkpoint)
    results = []
    if evaluate and not resume:
        results.append(("before RL", trainer.evaluate()))
    train_or_exit(trainer, resume)
    if evaluate:
        results.append((f"after {trainer._name}", trainer.evaluate()))
    if training_args.push_to_hub:  # saves locally first, then pushes the policy and the critic with their cards
        trainer.push_to_hub(dataset_name=dataset_name)
    else:
        trainer.save_model(training_args.output_dir)
    if results and trainer.is_world_process_zero():
        if not resume:
            results[0] = ("after cold start" if toy else "initial policy", results[0][1])
        print("\n" + format_results_table(results) + "\n")


def resume_target(resume_from_checkpoint):
    """`--resume_from_checkpoint` as `Trainer.train` takes it: "true" or "latest" is True, the latest
    checkpoint-<step> in output_dir."""
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() in ("true", "latest"):
        return True
    return resume_from_checkpoint


def train_or_exit(trainer: VCPPOTrainer, resume) -> None:
    """`trainer.train()`. Stopped by a signal, every rank agreed on the stop and saved the checkpoint together: this
    process leaves the process group and exits with the stop's status."""
    try:
        trainer.train(resume_from_checkpoint=resume)
    except TrainingInterrupted as stop:
        logger.error(str(stop))
        leave_process_group(trainer)
        raise SystemExit(stop.exit_code) from None


def format_results_table(rows: list[tuple[str, dict]]) -> str:
    """A plain-text table of held-out accuracy and response length at each stage."""
    lines = [f"{'stage':<22}{'held-out accuracy':>20}{'mean response length':>24}"]
    for stage, metrics in rows:
        acc = metrics.get("eval_accuracy", float("nan"))
        length = metrics.get("eval_response_length_mean", float("nan"))
        lines.append(f"{stage:<22}{acc:>20.3f}{length:>24.1f}")
    return "\n".join(lines)
