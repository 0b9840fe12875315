"""ZeRO-3 checkpoints on another number of processes, through DeepSpeed's universal checkpoints.

A ZeRO-3 checkpoint holds one partition of the weights and optimizer states per process (`global_step*/`), so it can
only be loaded by as many processes as wrote it. DeepSpeed's own tool, `deepspeed.checkpoint.ds_to_universal`,
rewrites those partitions as one file per parameter (fp32 weights, Adam's two moments), which an engine built with
`checkpoint: {load_universal: true}` loads on any number of processes. Here:

- [`convert_to_universal`] runs that tool on `checkpoint-<step>/global_step<N>/` and puts the result in
  `checkpoint-<step>/universal/` (`latest_universal` and `global_step<N>/`). It writes to
  `checkpoint-<step>/tmp-universal-<pid>/` and renames it once complete, so the original files are never touched and
  an interrupted conversion leaves only a `tmp-` directory (removed by the next conversion). An existing `universal/`
  is reused. The trainer converts automatically when a ZeRO-3 checkpoint is resumed on another number of processes
  (the main process converts, the others wait); for a large model convert beforehand with the one command

      python -m vcppo_trl.universal_checkpoint <output_dir>/checkpoint-<step> [--workers 8]

  so that the resumed job does not wait for it (its other processes wait at a collective, up to `ddp_timeout`).
- [`restore_role_groups`] repairs, after the engine loaded a universal checkpoint, what DeepSpeed's ZeRO-3 loader
  flattens: `load_hp_checkpoint_state_from_checkpoint_dir_stage3` (deepspeed/runtime/zero/stage3.py) gives every
  parameter group the hyperparameters of the saved group 0 and every sub-group the Adam step count of the saved
  state 0. The policy and the critic share one engine in separate groups, with their own learning rates, `role` keys
  and step counts (the policy's optimizer state restarts at its first PPO update), so each group gets back its own
  saved hyperparameters and step count. A checkpoint saved at the end of value pretraining, when the policy has no
  optimizer state at all, is converted with a fresh state filled in and loaded with none (see
  `_with_every_optimizer_state`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import torch

from .files import CheckpointError, _fsync_tree

UNIVERSAL_DIRNAME = "universal"
UNIVERSAL_TEMP_PREFIX = "tmp-universal-"
LATEST_UNIVERSAL = "latest_universal"


def deepspeed_tag(checkpoint: str) -> str:
    """The DeepSpeed tag (`global_step<N>`) that `checkpoint/latest` names."""
    path = os.path.join(checkpoint, "latest")
    try:
        with open(path) as f:
            tag = f.read().strip()
    except OSError as exc:
        raise CheckpointError(
            f"Cannot read {path} ({exc}): {checkpoint} is not a complete DeepSpeed checkpoint."
        ) from exc
    if not os.path.isdir(os.path.join(checkpoint, tag)):
        raise CheckpointError(
            f"{path} names {tag}, which is not a directory of {checkpoint}: the checkpoint is damaged."
        )
    return tag


def universal_dir(checkpoint: str) -> str:
    return os.path.join(checkpoint, UNIVERSAL_DIRNAME)


def is_converted(checkpoint: str) -> bool:
    """Whether `checkpoint/universal/` holds a finished conversion of this checkpoint's DeepSpeed states."""
    target = universal_dir(checkpoint)
    latest = os.path.join(target, LATEST_UNIVERSAL)
    if not os.path.isfile(latest):
        return False
    with open(latest) as f:
        tag = f.read().strip()
    return tag == deepspeed_tag(checkpoint) and os.path.isdir(os.path.join(target, tag, "zero"))


def convert_to_universal(checkpoint: str, workers: int = 1) -> str:
    """
    Convert `checkpoint`'s ZeRO states with DeepSpeed's `ds_to_universal` into `checkpoint/universal/` (atomically)
    and return that directory; a finished conversion already there is reused. Run it on one process only.

    Raises:
        [`~checkpoint.files.CheckpointError`]: the tool failed (its output is in the message); nothing is left behind.
    """
    checkpoint = os.path.abspath(checkpoint)
    target = universal_dir(checkpoint)
    if is_converted(checkpoint):
        return target
    tag = deepspeed_tag(checkpoint)
    for name in os.listdir(checkpoint):  # an earlier conversion that was interrupted
        if name.startswith(UNIVERSAL_TEMP_PREFIX):
            shutil.rmtree(os.path.join(checkpoint, name), ignore_errors=True)
    if os.path.exists(target):  # a universal/ of another tag: replaced below
        shutil.rmtree(target)
    temp = os.path.join(checkpoint, f"{UNIVERSAL_TEMP_PREFIX}{os.getpid()}")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    try:
        os.makedirs(temp)
        try:
            source = _with_every_optimizer_state(os.path.join(checkpoint, tag), os.path.join(temp, "input"))
        except Exception as exc:
            raise CheckpointError(
                f"DeepSpeed's universal-checkpoint conversion of {checkpoint} failed: cannot read its optimizer "
                f"states ({type(exc).__name__}: {exc}); the checkpoint is damaged, resume from an earlier one."
            ) from exc
        command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal"]
        command += ["--input_folder", source, "--output_folder", os.path.join(temp, tag)]
        command += ["--num_extract_workers", str(workers), "--num_merge_workers", str(workers)]
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise CheckpointError(
                f"DeepSpeed's universal-checkpoint conversion of {checkpoint} failed (exit {proc.returncode}); the "
                f"checkpoint itself is unchanged. Command: {' '.join(command)}\n"
                f"{(proc.stdout[-2000:] + proc.stderr[-4000:]).strip()}"
            )
        if not os.path.isfile(os.path.join(temp, LATEST_UNIVERSAL)):
            raise CheckpointError(f"DeepSpeed's conversion of {checkpoint} wrote no {LATEST_UNIVERSAL}: {proc.stdout}")
        shutil.rmtree(os.path.join(temp, "input"), ignore_errors=True)
        _fsync_tree(temp)
        os.replace(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return target


def _with_every_optimizer_state(source: str, view: str) -> str:
    """
    The folder to give `ds_to_universal`: `source` itself, or, when an optimizer file lacks the state of a sub-group,
    `view` with links to `source`'s files and a copy of each such file where that state is a fresh one (step 0, zero
    moments). DeepSpeed's tool reads every sub-group's `exp_avg` (ds_to_universal.py, `extract_zero_shards_stage3`)
    and fails with `KeyError` without it, which happens at the end of value pretraining: the policy's state is reset
    there (`distributed.reset_optimizer_state`) and a checkpoint saved then has none. A step count of 0 marks such a
    state; [`restore_role_groups`] drops it again after loading, so the policy starts PPO from a fresh state as the
    uninterrupted run does.
    """
    names = sorted(os.listdir(source))
    patched: dict[str, dict] = {}
    for name in names:
        if not name.endswith("_optim_states.pt"):
            continue
        saved = torch.load(os.path.join(source, name), map_location="cpu", weights_only=False)
        zero_state = saved["optimizer_state_dict"]
        flats, state = zero_state["fp32_flat_groups"], zero_state["optimizer_state_dict"]["state"]
        missing = [i for i in range(len(flats)) if not {"exp_avg", "exp_avg_sq"} <= set(state.get(i, {}))]
        if not missing:
            continue
        steps = [s["step"] for s in state.values() if "step" in s]
        for i in missing:
            step = torch.zeros_like(steps[0]) if steps and torch.is_tensor(steps[0]) else torch.tensor(0.0)
            state[i] = {"step": step, "exp_avg": torch.zeros_like(flats[i]), "exp_avg_sq": torch.zeros_like(flats[i])}
        patched[name] = saved
    if not patched:
        return source
    os.makedirs(view)
    for name in names:
        if name in patched:
            torch.save(patched[name], os.path.join(view, name))
        else:
            os.symlink(os.path.join(source, name), os.path.join(view, name))
    return view


def load_universal(engine, checkpoint: str) -> None:
    """
    Load `checkpoint/universal/` into a DeepSpeed engine built with `checkpoint: {load_universal: true}` (weights,
    optimizer states, partitioned for this run's processes), then give each parameter group back its own saved
    hyperparameters and step count ([`restore_role_groups`]).
    """
    if not engine.load_universal_checkpoint():
        raise RuntimeError(
            "The DeepSpeed engine was not built with `checkpoint: {load_universal: true}`; it cannot read "
            f"{universal_dir(checkpoint)}."
        )
    source = universal_dir(checkpoint)
    load_path, _ = engine.load_checkpoint(
        source, load_module_strict=True, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if load_path is None:
        raise CheckpointError(f"DeepSpeed could not load the universal checkpoint in {source}.")
    with open(os.path.join(source, LATEST_UNIVERSAL)) as f:
        tag = f.read().strip()
    restore_role_groups(engine.optimizer, os.path.join(source, tag, "zero", "optimizer_state.pt"))


def restore_role_groups(zero_optimizer, optimizer_state_path: str) -> None:
    """
    After a universal load: each parameter group's hyperparameters (lr, weight decay, betas, `role`, ...) and each
    sub-group's Adam step count, from the saved optimizer's groups (`optimizer_state.pt` of the universal checkpoint:
    the base optimizer's `state_dict()` of the saving run's process 0, whose `param_groups[g]["params"]` are the
    indices of group `g`'s sub-groups in its `state`).
    """
    needed = ("optimizer", "fp32_partitioned_groups_flat", "sub_group_to_group_id")
    if not all(hasattr(zero_optimizer, name) for name in needed):
        raise CheckpointError(
            f"Resuming on another number of processes needs a ZeRO-3 optimizer; this engine's is a "
            f"{type(zero_optimizer).__name__}. Resume with the number of processes that saved the checkpoint."
        )
    if getattr(zero_optimizer, "swap_optimizer", False):
        raise CheckpointError(
            "Resuming on another number of processes with the optimizer states offloaded to NVMe is not supported: "
            "resume with the number of processes that saved the checkpoint, or offload to CPU instead."
        )
    saved = torch.load(optimizer_state_path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    base = zero_optimizer.optimizer
    saved_groups, saved_state = saved["param_groups"], saved["state"]
    if len(saved_groups) != len(base.param_groups):
        raise CheckpointError(
            f"The checkpoint's optimizer has {len(saved_groups)} parameter groups, this run's has "
            f"{len(base.param_groups)}: resume with the model and configuration the checkpoint was saved with."
        )
    steps = {}
    for index, (group, saved_group) in enumerate(zip(base.param_groups, saved_groups)):
        for key, value in saved_group.items():
            if key != "params":
                group[key] = value
        states = [saved_state[i] for i in saved_group["params"] if i in saved_state and "step" in saved_state[i]]
        if states:
            steps[index] = states[0]["step"]
    for sub_group, flat in enumerate(zero_optimizer.fp32_partitioned_groups_flat):
        group = zero_optimizer.sub_group_to_group_id[sub_group]
        state = base.state.get(flat)
        if state is None or "step" not in state or group not in steps:
            continue
        step = steps[group]
        if float(step) == 0:  # a group that had no state when saved (see _with_every_optimizer_state): fresh again
            del base.state[flat]
            continue
        if torch.is_tensor(state["step"]):
            state["step"] = torch.as_tensor(step, dtype=state["step"].dtype, device=state["step"].device).clone()
        else:
            state["step"] = type(state["step"])(step.item() if torch.is_tensor(step) else step)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m vcppo_trl.universal_checkpoint",
        description="Convert a ZeRO-3 checkpoint-<step> directory with DeepSpeed's ds_to_universal, into "
        "checkpoint-<step>/universal/, so that it resumes on another number of processes (the trainer does this "
        "itself when needed; run it beforehand for a large model).",
    )
    parser.add_argument("checkpoint", help="a checkpoint-<step> directory written under DeepSpeed ZeRO-3")
    parser.add_argument("--workers", type=int, default=1, help="processes for DeepSpeed's extract and merge passes")
    args = parser.parse_args(argv)
    try:
        target = convert_to_universal(args.checkpoint, workers=args.workers)
    except CheckpointError as exc:
        sys.exit(f"error: {exc}")
    print(f"Universal checkpoint in {target}")
