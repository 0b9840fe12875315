"""Model cards: what a pushed or saved policy or critic is, its base model, the method and its settings, citations.

The cards are rendered from a [`RunCard`], what the trainer says of its run (`trainer/saving.py` `run_card`); which card
goes into which folder and repo is [`~checkpoint.hub`]'s business.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal

from huggingface_hub import ModelCard, ModelCardData

PAPER_ID = "2503.01491"
PAPER_TITLE = "What's Behind PPO's Collapse in Long-CoT? Value Optimization Holds the Secret"
VAPO_PAPER_ID = "2504.05118"
VAPO_PAPER_TITLE = "VAPO: Efficient and Reliable Reinforcement Learning for Advanced Reasoning Tasks"
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

Role = Literal["policy", "critic", "pretrained-critic"]


@dataclasses.dataclass(frozen=True)
class RunCard:
    """What every card of a run says about it, gathered by the trainer (`trainer/saving.py` `run_card`)."""

    policy_source: str | None  # the name or path the policy came from (the adapter's base under PEFT), or None
    facts: dict[str, Any]  # the method and its settings: one row of the card's table each
    tags: list[str]  # the trainer's tags; each card adds its own


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


def base_model_info(policy_source: str | None) -> tuple[str | None, str]:
    """
    The policy's base model: `(hub_id, description)`, from `policy_source`, the name or path the policy came from (the
    adapter's base under PEFT).

    `hub_id` is what the card's `base_model` metadata links (a Hub id, or the Hub model a local checkpoint's own card
    names as its base), `None` when there is none; `description` says where the weights came from, local paths
    included.
    """
    if not policy_source:
        return None, "a model built in-process (no checkpoint)"
    if os.path.isdir(policy_source):
        upstream = _card_base_model(policy_source)
        local = os.path.abspath(policy_source)
        if upstream:
            return upstream, f"{upstream}, through the local checkpoint {local}"
        return None, f"the local checkpoint {local}"
    return policy_source, policy_source


def base_model_name(policy_source: str | None) -> str | None:
    """The policy's base model as a Hub id (the adapter's base under PEFT), or `None` when there is none."""
    return base_model_info(policy_source)[0]


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
    has_critic: bool = True,
) -> ModelCard:
    """
    The model card of a policy or a critic: what it is, its base model, the method and its λs, the data, citations.
    """
    algorithm = facts.get("algorithm", "PPO")
    critic = role != "policy"
    datasets = [dataset_name] if isinstance(dataset_name, str) else dataset_name
    card_tags = ["generated_from_trainer", *tags, "reinforcement-learning"]
    if algorithm in ("VC-PPO", "VAPO"):
        card_tags.append("vc-ppo")
    if algorithm == "VAPO":
        card_tags.append("vapo")
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
        if not has_critic:
            estimator = facts.get("advantage estimator", "a group baseline")
            what += f" It was trained without a critic: its advantages are {estimator}."
        elif companion_repo:
            what += f" Its critic (value model) is [{companion_repo}](https://huggingface.co/{companion_repo})."
        else:
            what += " Its critic (value model) was saved with it, in the `value_model/` folder of the run's output."
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
    if algorithm == "VAPO":
        paper += (
            f" VAPO, [{VAPO_PAPER_TITLE}](https://huggingface.co/papers/{VAPO_PAPER_ID}) (arXiv {VAPO_PAPER_ID}), "
            "adds length-adaptive GAE, clip-higher, a positive-example LM loss and group sampling."
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
    role: Role,
    folder: str,
    repo_id: str,
    *,
    run: RunCard,
    companion_repo: str | None = None,
    dataset_name: str | list[str] | None = None,
    tags: list[str] | None = None,
    has_critic: bool = True,
) -> ModelCard:
    """Render the card of the checkpoint in `folder` (its role in the `run`) and save it there as `README.md`
    (`has_critic=False`: a policy trained without a critic)."""
    base_model, base_description = base_model_info(run.policy_source)
    card = render_card(
        role,
        repo_id,
        facts=run.facts,
        base_model=base_model,
        base_description=base_description,
        dataset_name=dataset_name,
        tags=list(run.tags) + list(tags or []),
        is_adapter=_is_adapter(folder),
        companion_repo=companion_repo,
        has_critic=has_critic,
    )
    card.save(os.path.join(folder, "README.md"))
    return card
