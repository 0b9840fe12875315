"""Pushing the policy and the critic to the Hugging Face Hub, each with a model card that says what it is.

`PPOTrainer.push_to_hub()` saves locally first (policy in `output_dir`, critic in `output_dir/value_model`), then pushes
the policy (or its PEFT adapter) to `hub_model_id` and the critic to `value_hub_model_id` (default
`<hub_model_id>-value`). With `VCPPOConfig(value_pretrain_push=True)` the critic is also pushed right after value
pretraining to `value_pretrain_hub_model_id` (default `<hub_model_id>-value-pretrained`), so that other runs can
start from it with `value_model_path=<repo id>`.

Repos are created on the first push (not when the trainer is built), private when `hub_private_repo` is set, and
commits go to `hub_revision` (a branch, created when missing) when it is set. A push that cannot reach the Hub raises
[`HubPushError`]; the local checkpoint it was pushing is complete by then.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from huggingface_hub import CommitInfo, HfApi, ModelCard, ModelCardData
from transformers.utils import logging

from .checkpointing import VALUE_MODEL_DIRNAME

if TYPE_CHECKING:
    from transformers import (
        Trainer,  # the PPOTrainer (typed as its transformers base: no import back into the trainer)
    )

logger = logging.get_logger(__name__)

PAPER_ID = "2503.01491"
PAPER_TITLE = "What's Behind PPO's Collapse in Long-CoT? Value Optimization Holds the Secret"
PAPER_CITATION = """@article{yuan2025vcppo,
  title   = {{What's Behind PPO's Collapse in Long-CoT? Value Optimization Holds the Secret}},
  author  = {Yuan, Yufeng and Yue, Yu and Zhu, Ruofei and Fan, Tiantian and Yan, Lin},
  journal = {arXiv preprint arXiv:2503.01491},
  year    = {2025}
}"""
TRL_CITATION = """@software{vonwerra2020trl,
  title   = {{TRL: Transformers Reinforcement Learning}},
  author  = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
  license = {Apache-2.0},
  url     = {https://github.com/huggingface/trl},
  year    = {2020}
}"""

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

Role = Literal["policy", "critic", "pretrained-critic"]


class HubPushError(RuntimeError):
    """A push to the Hub failed (no network, no permission, ...); the local checkpoint is complete."""


# ------------------------------------------------------------------ repo ids


def policy_repo_id(args) -> str:
    """The policy's repo: `hub_model_id`, or the name of `output_dir` (the Hub then adds the user's namespace)."""
    return args.hub_model_id or Path(args.output_dir).absolute().name


def value_repo_id(args) -> str:
    """The critic's repo: `value_hub_model_id`, default `<hub_model_id>-value`."""
    return getattr(args, "value_hub_model_id", None) or f"{policy_repo_id(args)}-value"


def pretrained_value_repo_id(args) -> str:
    """The pretrained critic's repo: `value_pretrain_hub_model_id`, default `<value repo>-pretrained`."""
    return getattr(args, "value_pretrain_hub_model_id", None) or f"{value_repo_id(args)}-pretrained"


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


def push_trainer(
    trainer: Trainer,
    commit_message: str = "End of training",
    token: str | None = None,
    revision: str | None = None,
    private: bool | None = None,
    dataset_name: str | list[str] | None = None,
    tags: list[str] | None = None,
    **kwargs,
) -> dict[str, CommitInfo] | None:
    """
    Save the policy and the critic locally, write their model cards, and push them to their two repos.

    Returns:
        `{"policy": CommitInfo, "value": CommitInfo}` on the main process, `None` on the others.
    """
    args = trainer.args
    token = token if token is not None else args.hub_token
    private = private if private is not None else args.hub_private_repo
    revision = revision if revision is not None else args.hub_revision
    trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    if dataset_name is not None:
        trainer.model_card_dataset_name = dataset_name  # later saves keep naming it
    trainer.save_model(_internal_call=True)  # every process (sharded states are gathered)
    if not trainer.is_world_process_zero():
        return None

    policy_dir = args.output_dir
    value_dir = os.path.join(args.output_dir, VALUE_MODEL_DIRNAME)
    policy_id, value_id = policy_repo_id(args), value_repo_id(args)
    write_cards(trainer, args.output_dir, dataset_name=dataset_name, tags=tags)
    push = {"token": token, "private": private, "revision": revision, "commit_message": commit_message}
    commands = [
        upload_command(policy_id, policy_dir, POLICY_IGNORE_PATTERNS, revision, private),
        upload_command(value_id, value_dir, None, revision, private),
    ]
    try:
        policy_commit = push_folder(
            policy_dir, policy_id, what="policy", ignore_patterns=POLICY_IGNORE_PATTERNS, **push
        )
    except HubPushError as err:
        # Two models, two repos: one command each (a plain `hf upload <repo> <output_dir>` would put the critic's
        # folder inside the policy's repo).
        raise HubPushError(
            f"{err} Nothing was pushed; to push both models by hand, each to its own repo:\n  " + "\n  ".join(commands)
        ) from err.__cause__
    value_commit = push_folder(value_dir, value_id, what="critic (value model)", **push)
    logger.warning(f"Pushed the policy to {policy_commit.repo_url} and the critic to {value_commit.repo_url}.")
    return {"policy": policy_commit, "value": value_commit}


def push_pretrained_critic(trainer: Trainer, folder: str, steps: int) -> CommitInfo | None:
    """
    Push a value-pretrained critic (saved in `folder`) with its card; on failure log the error and return `None`.

    Training goes on after a failed push: the critic is on disk and the message says how to push it later.
    """
    if not trainer.is_world_process_zero():
        return None
    args = trainer.args
    repo_id = pretrained_value_repo_id(args)
    write_card(
        trainer, "pretrained-critic", folder, repo_id, companion_repo=policy_repo_id(args), pretrain_steps=steps
    )
    try:
        commit = push_folder(
            folder,
            repo_id,
            what="pretrained critic",
            token=args.hub_token,
            private=args.hub_private_repo,
            revision=args.hub_revision,
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


# ---------------------------------------------------------------- the cards


def _hub_name(name_or_path: str | None) -> str | None:
    """A Hub id worth linking as `base_model`, or `None` for local paths and in-process models."""
    if not name_or_path or os.path.isdir(name_or_path) or name_or_path.startswith((".", "/")):
        return None
    return name_or_path


def _card_base_model(folder: str) -> str | None:
    """The `base_model` a local checkpoint's own model card names (e.g. a local fine-tune of a Hub model)."""
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return None
    try:
        base = ModelCard.load(path).data.to_dict().get("base_model")
    except Exception:  # a README that is not a model card says nothing about the base model
        return None
    base = base[0] if isinstance(base, list) and base else base
    return base if isinstance(base, str) else None


def _policy_source(trainer: Trainer) -> str | None:
    policy, _ = trainer.unwrapped_policy_and_critic()
    peft_config = getattr(policy, "peft_config", None)
    if peft_config:
        return getattr(next(iter(peft_config.values())), "base_model_name_or_path", None)
    return getattr(policy.config, "_name_or_path", None)


def base_model_info(trainer: Trainer) -> tuple[str | None, str]:
    """
    The policy's base model: `(hub_id, description)`.

    `hub_id` is what the card's `base_model` metadata links (a Hub id, or the Hub model a local checkpoint's own card
    names as its base), `None` when there is none; `description` says where the weights came from, local paths
    included (the adapter's base under PEFT).
    """
    source = _policy_source(trainer)
    if not source:
        return None, "a model built in-process (no checkpoint)"
    if os.path.isdir(source):
        upstream = _card_base_model(source)
        local = os.path.abspath(source)
        if upstream:
            return upstream, f"{upstream}, through the local checkpoint {local}"
        return None, f"the local checkpoint {local}"
    return source, source


def base_model_name(trainer: Trainer) -> str | None:
    """The policy's base model as a Hub id (the adapter's base under PEFT), or `None` when there is none."""
    return base_model_info(trainer)[0]


def framework_versions() -> dict[str, str]:
    """Versions of the libraries a training run depends on, as the card lists them."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for label, dist in (
        ("vcppo-trl", "vcppo-trl"),
        ("TRL", "trl"),
        ("Transformers", "transformers"),
        ("PyTorch", "torch"),
        ("Accelerate", "accelerate"),
        ("Datasets", "datasets"),
        ("Tokenizers", "tokenizers"),
        ("PEFT", "peft"),
        ("DeepSpeed", "deepspeed"),
        ("math-verify", "math-verify"),
    ):
        try:
            versions[label] = version(dist)
        except PackageNotFoundError:
            continue
    return versions


def training_facts(trainer: Trainer, pretrain_steps: int | None = None) -> dict[str, Any]:
    """The method and its settings, as the cards state them."""
    args = trainer.args
    vc = hasattr(args, "lam_actor")
    facts: dict[str, Any] = {"algorithm": "VC-PPO" if vc else "PPO"}
    if vc:
        facts["λ_actor (policy advantages)"] = (
            f"1 − 1/({args.lam_actor_length_alpha}·length) per response (VAPO)"
            if args.lam_actor_length_alpha is not None
            else args.lam_actor
        )
        facts["λ_critic (value targets)"] = args.lam_critic
        callback = getattr(trainer, "value_pretrain_callback", None)
        if pretrain_steps is None:
            pretrain_steps = callback.steps if callback is not None and callback.done else None
        if args.value_model_path is not None:
            facts["value pretraining"] = f"critic loaded from {args.value_model_path} (pretrained before this run)"
        elif pretrain_steps is not None:
            facts["value-pretraining steps"] = pretrain_steps
        else:
            facts["value-pretraining steps"] = f"{args.value_pretrain_steps} (configured)"
    else:
        facts["λ (GAE)"] = args.lam
    facts.update(
        {
            "γ": args.gamma,
            "KL coefficient": args.kl_coef,
            "policy learning rate": args.learning_rate,
            "critic learning rate": args.value_learning_rate,
            "training updates run (value pretraining included)": trainer.state.global_step
            if trainer.state is not None
            else 0,
            "prompts per update": getattr(trainer, "prompts_per_update", None),
            "responses per prompt": args.num_generations,
            "sampler": "vLLM" if args.use_vllm else "transformers generate",
            "response length": args.response_length,
        }
    )
    return facts


def _is_adapter(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "adapter_config.json"))


def render_card(
    role: Role,
    repo_id: str,
    *,
    facts: dict[str, Any],
    base_model: str | None,
    dataset_name: str | list[str] | None,
    tags: list[str],
    is_adapter: bool,
    companion_repo: str | None,
    base_description: str | None = None,
    versions: dict[str, str] | None = None,
) -> ModelCard:
    """
    The model card of a policy or a critic: what it is, its base model, the method and its λs, the data, citations.
    """
    algorithm = facts.get("algorithm", "PPO")
    critic = role != "policy"
    datasets = [dataset_name] if isinstance(dataset_name, str) else dataset_name
    card_tags = ["generated_from_trainer", *tags, "reinforcement-learning"]
    if algorithm == "VC-PPO":
        card_tags.append("vc-ppo")
    if critic:
        card_tags += ["value-model", "critic"]
    if is_adapter:
        card_tags += ["peft", "lora"]
    card_tags = list(dict.fromkeys(card_tags))
    card_data = ModelCardData(
        base_model=base_model,
        datasets=datasets,
        library_name="peft" if is_adapter else "transformers",
        pipeline_tag="token-classification" if critic else "text-generation",
        model_name=repo_id.split("/")[-1],
        tags=card_tags,
    )
    base_description = base_description or base_model or "a local base model"
    if base_model and base_description == base_model:
        base = f"[{base_model}](https://huggingface.co/{base_model})"
    else:
        base = base_description
    data = ", ".join(f"[{d}](https://huggingface.co/datasets/{d})" for d in datasets) if datasets else None
    kind = " (a PEFT/LoRA adapter)" if is_adapter else ""
    if role == "policy":
        what = (
            f"This is the **policy**{kind} of a {algorithm} run: a causal language model fine-tuned from {base} with "
            f"reinforcement learning."
        )
        if companion_repo:
            what += f" Its critic (value model) is [{companion_repo}](https://huggingface.co/{companion_repo})."
    else:
        stage = (
            "value-pretrained on rollouts of the frozen initial policy (λ = 1, Monte-Carlo returns), before any "
            "policy update"
            if role == "pretrained-critic"
            else f"trained alongside the policy by {algorithm}"
        )
        what = (
            f"This is the **critic (value model)**{kind} of a {algorithm} run, {stage}. It shares the architecture of "
            f"{base} with a scalar head: a token-classification model with `num_labels=1` that gives V(s_t) for "
            "every token. It is not a language model or a reward model."
        )
        if companion_repo:
            what += f" The policy of the run is [{companion_repo}](https://huggingface.co/{companion_repo})."
    if data:
        what += f" Training prompts: {data}."
    rows = "\n".join(f"| {k} | {v} |" for k, v in facts.items())
    if role == "policy":
        usage = (
            "from peft import AutoPeftModelForCausalLM\n\n"
            f'model = AutoPeftModelForCausalLM.from_pretrained("{repo_id}")'
            if is_adapter
            else f'from transformers import pipeline\n\ngenerator = pipeline("text-generation", model="{repo_id}")'
        )
    else:
        load = (
            "from peft import AutoPeftModelForTokenClassification\n\n"
            f'critic = AutoPeftModelForTokenClassification.from_pretrained("{repo_id}", num_labels=1)'
            if is_adapter
            else "from transformers import AutoModelForTokenClassification\n\n"
            f'critic = AutoModelForTokenClassification.from_pretrained("{repo_id}")  # num_labels == 1'
        )
        usage = (
            f"{load}\nvalues = critic(input_ids).logits[..., 0]  # [B, T]: V(s_t)\n\n"
            "# or start a VC-PPO run from this critic (value pretraining is then skipped):\n"
            f'# VCPPOConfig(..., value_model_path="{repo_id}")'
        )
    paper = (
        f"VC-PPO is introduced in [{PAPER_TITLE}](https://huggingface.co/papers/{PAPER_ID}) "
        f"(arXiv {PAPER_ID}): value pretraining of the critic, then decoupled GAE (λ_critic = 1, λ_actor ≈ 0.95)."
    )
    versions_list = "\n".join(f"- {name}: {v}" for name, v in (versions or framework_versions()).items())
    content = f"""---
{card_data.to_yaml()}
---

# {repo_id.split("/")[-1]}

{what}

Trained with vcppo-trl, a TRL-compatible {algorithm} trainer built on [TRL](https://github.com/huggingface/trl).
{paper}

## Training

| setting | value |
| --- | --- |
| role | {"policy" if role == "policy" else "critic (value model)"} |
| base model | {base_description} |
{rows}

## Usage

```python
{usage}
```

## Framework versions

{versions_list}

## Citations

```bibtex
{PAPER_CITATION}
```

```bibtex
{TRL_CITATION}
```
"""
    return ModelCard(content)


def write_card(
    trainer: Trainer,
    role: Role,
    folder: str,
    repo_id: str,
    companion_repo: str | None = None,
    dataset_name: str | list[str] | None = None,
    tags: list[str] | None = None,
    pretrain_steps: int | None = None,
) -> ModelCard:
    """Render the card of the checkpoint in `folder` and save it there as `README.md`."""
    base_model, base_description = base_model_info(trainer)
    card = render_card(
        role,
        repo_id,
        facts=training_facts(trainer, pretrain_steps=pretrain_steps),
        base_model=base_model,
        base_description=base_description,
        dataset_name=dataset_name,
        tags=list(trainer._tag_names) + list(tags or []),
        is_adapter=_is_adapter(folder),
        companion_repo=companion_repo,
    )
    card.save(os.path.join(folder, "README.md"))
    return card


def write_cards(
    trainer: Trainer,
    output_dir: str,
    dataset_name: str | list[str] | None = None,
    tags: list[str] | None = None,
) -> None:
    """The cards of a saved run: the policy's in `output_dir`, the critic's in `output_dir/value_model`."""
    args = trainer.args
    policy_id, value_id = policy_repo_id(args), value_repo_id(args)
    write_card(trainer, "policy", output_dir, policy_id, companion_repo=value_id, dataset_name=dataset_name, tags=tags)
    value_dir = os.path.join(output_dir, VALUE_MODEL_DIRNAME)
    if os.path.isdir(value_dir):
        write_card(
            trainer, "critic", value_dir, value_id, companion_repo=policy_id, dataset_name=dataset_name, tags=tags
        )
