"""Pushing the policy and the critic to the Hugging Face Hub, each with a model card that says what it is.

`PPOTrainer.push_to_hub()` saves locally first (policy in `output_dir`, critic in `output_dir/value_model`), then pushes
the policy (or its PEFT adapter) to `hub_model_id` and the critic to `value_hub_model_id` (default
`<hub_model_id>-value`). With `VCPPOConfig(value_pretrain_push=True)` the critic is also pushed right after value
pretraining to `value_pretrain_hub_model_id` (default `<hub_model_id>-value-pretrained`), so that other runs can
start from it with `value_model_path=<repo id>`.

Repos are created on the first push (not when the trainer is built), private when `hub_private_repo` is set, and
commits go to `hub_revision` (a branch, created when missing) when it is set. A push that cannot reach the Hub raises
[`HubPushError`]; the local checkpoint it was pushing is complete by then. The cards themselves are rendered in
[`~checkpoint.model_cards`]. These functions take folders, repo ids and [`HubSettings`], never the trainer: the trainer
gathers what they need (`trainer/saving.py`).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from huggingface_hub import CommitInfo, HfApi
from transformers.utils import logging

from .files import VALUE_MODEL_DIRNAME
from .model_cards import RunCard, write_card

if TYPE_CHECKING:
    from ..config.ppo import PPOConfig  # for the annotation only: checkpoint/ imports nothing else of the package

__all__ = [
    "POLICY_IGNORE_PATTERNS",
    "HubPushError",
    "HubSettings",
    "push_folder",
    "push_models",
    "push_pretrained_critic",
    "upload_command",
    "write_cards",
]

logger = logging.get_logger(__name__)

# Never pushed with the policy: the critic's folders (pushed to their own repo), checkpoints and run logs.
POLICY_IGNORE_PATTERNS = [
    "_*",
    "checkpoint-*",
    "tmp-checkpoint-*",
    "value_model/*",
    "value_pretrained*",
    "cold_start/*",
    "runs/*",
]


class HubPushError(RuntimeError):
    """A push to the Hub failed (no network, no permission, ...); the local checkpoint is complete."""


# ------------------------------------------------------------------ repo ids


@dataclasses.dataclass(frozen=True)
class HubSettings:
    """What the Hub pushes read of the config: the three repos and how to push to them. Build it at each push: a run
    may set `hub_model_id` (or change directory, which names the default repo) after the trainer was built."""

    policy_repo: str  # `hub_model_id`, or the name of `output_dir` (the Hub then adds the user's namespace)
    value_repo: str  # `value_hub_model_id`, default `<policy repo>-value`
    pretrained_value_repo: str  # `value_pretrain_hub_model_id`, default `<value repo>-pretrained`
    token: str | None  # `hub_token`, else the logged-in one
    private: bool | None  # `hub_private_repo`
    revision: str | None  # `hub_revision`: a branch, created when missing

    @classmethod
    def from_args(cls, args: PPOConfig) -> HubSettings:
        policy = args.hub_model_id or Path(args.output_dir).absolute().name
        value = getattr(args, "value_hub_model_id", None) or f"{policy}-value"  # a VCPPOConfig field
        pretrained = getattr(args, "value_pretrain_hub_model_id", None) or f"{value}-pretrained"
        return cls(policy, value, pretrained, args.hub_token, args.hub_private_repo, args.hub_revision)


# --------------------------------------------------------------- the pushing


def push_folder(
    folder: str,
    repo_id: str,
    *,
    what: str,
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str = "Upload model",
    ignore_patterns: list[str] | None = None,
) -> CommitInfo:
    """
    Create `repo_id` when needed (and the branch `revision`), then upload `folder` to it in one commit.

    The endpoint is `huggingface_hub`'s (`HF_ENDPOINT`), the token `token` or the logged-in one.

    Raises:
        [`HubPushError`]: when the Hub cannot be reached or refuses the push; the message names the local folder.
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Nothing to push: {folder} does not exist.")
    command = upload_command(repo_id, folder, ignore_patterns=ignore_patterns, revision=revision, private=private)
    try:
        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            revision=revision,
            commit_message=commit_message,
            ignore_patterns=ignore_patterns,
        )
    except Exception as err:  # network, offline mode, HTTP and auth errors all end the same way for the user
        raise HubPushError(
            f"Could not push the {what} to the Hub repo {repo_id!r} ({type(err).__name__}: {err}). The local "
            f"checkpoint in {folder} is complete; push it when the Hub is reachable (trainer.push_to_hub(), or "
            f"`{command}`)."
        ) from err


def upload_command(
    repo_id: str,
    folder: str,
    ignore_patterns: list[str] | None = None,
    revision: str | None = None,
    private: bool | None = None,
) -> str:
    """The `hf upload` command that pushes `folder` alone to `repo_id` (what [`push_folder`] would have pushed)."""
    parts = ["hf", "upload", repo_id, shlex.quote(folder), "."]
    for pattern in ignore_patterns or []:
        parts += ["--exclude", shlex.quote(pattern)]
    if revision and revision != "main":
        parts += ["--revision", shlex.quote(revision)]
    if private:
        parts.append("--private")
    return " ".join(parts)


def push_models(
    policy_dir: str,
    value_dir: str | None,
    *,
    policy_repo: str,
    value_repo: str,
    commit_message: str = "End of training",
    token: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
) -> dict[str, CommitInfo]:
    """
    Push a saved policy (`policy_dir`, without the critic's folders, checkpoints and logs: `POLICY_IGNORE_PATTERNS`)
    to `policy_repo` and its critic (`value_dir`) to `value_repo`, the policy first. Call on the main process.
    `value_dir=None`: the run had no critic (a group advantage estimator); the policy alone is pushed.

    Returns:
        `{"policy": CommitInfo, "value": CommitInfo}` (no `"value"` without a critic).

    Raises:
        [`HubPushError`]: the policy's push failed (nothing was pushed; the message gives one `hf upload` command per
            repo), or the critic's.
    """
    push = {"token": token, "private": private, "revision": revision, "commit_message": commit_message}
    commands = [upload_command(policy_repo, policy_dir, POLICY_IGNORE_PATTERNS, revision=revision, private=private)]
    if value_dir is not None:
        commands.append(upload_command(value_repo, value_dir, None, revision=revision, private=private))
    try:
        policy_commit = push_folder(
            policy_dir, policy_repo, what="policy", ignore_patterns=POLICY_IGNORE_PATTERNS, **push
        )
    except HubPushError as err:
        # Two models, two repos: one command each (a plain `hf upload <repo> <output_dir>` would put the critic's
        # folder inside the policy's repo).
        raise HubPushError(
            f"{err} Nothing was pushed; to push both models by hand, each to its own repo:\n  " + "\n  ".join(commands)
        ) from err.__cause__
    if value_dir is None:
        logger.warning(f"Pushed the policy to {policy_commit.repo_url} (the run has no critic).")
        return {"policy": policy_commit}
    value_commit = push_folder(value_dir, value_repo, what="critic (value model)", **push)
    logger.warning(f"Pushed the policy to {policy_commit.repo_url} and the critic to {value_commit.repo_url}.")
    return {"policy": policy_commit, "value": value_commit}


def push_pretrained_critic(folder: str, run: RunCard, settings: HubSettings, *, steps: int) -> CommitInfo | None:
    """
    Push a critic value-pretrained for `steps` updates (saved in `folder`) with its card to its repo
    (`settings.pretrained_value_repo`); on failure log the error and return `None`. Call on the main process.

    Training goes on after a failed push: the critic is on disk and the message says how to push it later.
    """
    repo_id = settings.pretrained_value_repo
    write_card("pretrained-critic", folder, repo_id=repo_id, run=run, companion_repo=settings.policy_repo)
    try:
        commit = push_folder(
            folder,
            repo_id,
            what="pretrained critic",
            token=settings.token,
            private=settings.private,
            revision=settings.revision,
            commit_message=f"Value-pretrained critic ({steps} updates)",
        )
    except HubPushError as err:
        logger.error(str(err))
        return None
    logger.warning(
        f"Pushed the pretrained critic to {commit.repo_url}; start other runs from it with "
        f"value_model_path={repo_id!r}."
    )
    return commit


def write_cards(
    output_dir: str,
    run: RunCard,
    *,
    policy_repo: str,
    value_repo: str,
    with_policy: bool,
    dataset_name: str | list[str] | None = None,
    tags: list[str] | None = None,
    pushed: bool = True,
    with_critic: bool = True,
) -> None:
    """The cards of a saved run: the policy's in `output_dir` (`with_policy=False` in a critic job, which saves no
    policy), the critic's in `output_dir/value_model`, each naming the other's repo when the run pushes them (`pushed`;
    otherwise the policy's card points at the critic's folder, not at a repo that may never exist). `with_critic=False`:
    the run had no critic (a group advantage estimator), and the policy's card says so."""
    if with_policy:
        write_card(
            "policy",
            output_dir,
            repo_id=policy_repo,
            run=run,
            companion_repo=value_repo if pushed and with_critic else None,
            dataset_name=dataset_name,
            tags=tags,
            has_critic=with_critic,
        )
    value_dir = os.path.join(output_dir, VALUE_MODEL_DIRNAME)
    if os.path.isdir(value_dir):
        write_card(
            "critic",
            value_dir,
            repo_id=value_repo,
            run=run,
            companion_repo=policy_repo if pushed else None,
            dataset_name=dataset_name,
            tags=tags,
        )
