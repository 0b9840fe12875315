"""TRL GRPO's `shuffle_dataset`, `chat_template_kwargs`, `pad_to_multiple_of` and `trust_remote_code` with TRL's
meanings (issue 47): how the config reads them, and the pure parts that act on them."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from vcppo_trl.rollout import ScoredSamples, padded_to_multiple, prompt_text
from vcppo_trl.sampling.seam import Samples
from vcppo_trl.trainer.prompts import prompt_batches

# A chat template that renders a keyword argument when it is given (as Qwen3's renders `enable_thinking`).
TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}<nothink>{% endif %}="
)


def test_the_four_fields_parse_as_trls(tiny_config):
    args = tiny_config(pad_to_multiple_of="8", chat_template_kwargs='{"enable_thinking": false}')
    assert args.pad_to_multiple_of == 8
    assert args.chat_template_kwargs == {"enable_thinking": False}
    assert tiny_config().pad_to_multiple_of is None  # "auto", TRL's default, pads only on AWS Neuron
    assert tiny_config(pad_to_multiple_of="none").pad_to_multiple_of is None
    assert tiny_config().shuffle_dataset is True and tiny_config().trust_remote_code is False


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("pad_to_multiple_of", 0, "pad_to_multiple_of` must be at least 1"),
        ("pad_to_multiple_of", "eight", "must be an int, 'auto' or None"),
        ("chat_template_kwargs", json.dumps([1, 2]), "must be a dict"),
    ],
)
def test_bad_values_are_refused_by_name(tiny_config, field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**{field: value})


def _stream(dataset, shuffle: bool, updates: int):
    batches = SimpleNamespace(prompts_per_update=4, local_prompts_per_update=4)  # what prompt_batches reads
    stream = prompt_batches(dataset, batches, rank=0, seed=3, num_generations=1, shuffle=shuffle)
    return [[row["i"] for row in next(stream)] for _ in range(updates)]


def test_without_shuffle_every_pass_draws_the_dataset_in_its_order():
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": [str(i) for i in range(8)], "i": list(range(8))})
    assert _stream(dataset, shuffle=False, updates=4) == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    shuffled = _stream(dataset, shuffle=True, updates=4)
    assert sorted(shuffled[0] + shuffled[1]) == list(range(8)) and shuffled[:2] != [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert shuffled[:2] != shuffled[2:]  # a new permutation each pass


def test_chat_template_kwargs_reach_the_chat_template(tokenizer):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path) if tokenizer.name_or_path else tokenizer
    tokenizer.chat_template = TEMPLATE
    messages = [{"role": "user", "content": "1+2"}]
    assert prompt_text(messages, tokenizer, None) == "1+2\n="
    assert prompt_text(messages, tokenizer, {"enable_thinking": False}) == "1+2\n<nothink>="
    assert prompt_text("1+2=", tokenizer, {"enable_thinking": False}) == "1+2="  # text prompts are not templated


def _scored(prompt_width: int, response_width: int, logprobs: bool) -> ScoredSamples:
    g = torch.Generator().manual_seed(0)
    query_ids = torch.randint(3, 50, (3, prompt_width), generator=g)
    response_ids = torch.randint(3, 50, (3, response_width), generator=g)
    response_mask = torch.arange(response_width).unsqueeze(0) < torch.tensor([[2], [response_width], [1]])
    samples = Samples(
        response_ids,
        response_mask,
        torch.tensor([True, False, True]),
        logprobs=torch.randn(3, response_width, generator=g) * response_mask if logprobs else None,
    )
    return ScoredSamples(
        query_ids,
        torch.ones_like(query_ids),
        samples,
        completions=["a", "b", "c"],
        rewards_per_func=torch.zeros(3, 1),
        reward_failed=torch.zeros(3, dtype=torch.bool),
        raw_scores=torch.zeros(3),
    )


@pytest.mark.parametrize("logprobs", [False, True])
def test_padding_to_a_multiple_pads_prompts_left_and_responses_right(logprobs):
    scored = _scored(prompt_width=5, response_width=11, logprobs=logprobs)
    padded = padded_to_multiple(scored, 8, pad_token_id=0)
    assert padded.query_ids.shape == (3, 8) and padded.samples.response_ids.shape == (3, 16)
    assert torch.equal(padded.query_ids[:, 3:], scored.query_ids) and (padded.query_ids[:, :3] == 0).all()
    assert (padded.query_mask[:, :3] == 0).all() and (padded.query_mask[:, 3:] == 1).all()
    assert torch.equal(padded.samples.response_ids[:, :11], scored.samples.response_ids)
    assert torch.equal(padded.samples.response_mask[:, :11], scored.samples.response_mask)
    assert not padded.samples.response_mask[:, 11:].any()
    if logprobs:
        assert torch.equal(padded.samples.logprobs[:, :11], scored.samples.logprobs)
    assert padded_to_multiple(scored, None, pad_token_id=0) is scored
    assert padded_to_multiple(_scored(8, 16, logprobs), 8, pad_token_id=0).query_ids.shape == (3, 8)


MODELING_CUSTOM = """
from torch import nn
from transformers import LlamaForCausalLM, LlamaForTokenClassification, LlamaModel, LlamaPreTrainedModel

from .configuration_custom import CustomConfig


class CustomModel(LlamaModel):
    config_class = CustomConfig


class CustomForCausalLM(LlamaForCausalLM):
    config_class = CustomConfig


class CustomForTokenClassification(LlamaPreTrainedModel):
    config_class = CustomConfig

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = CustomModel(config)
        self.dropout = nn.Dropout(0.0)
        self.score = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    forward = LlamaForTokenClassification.forward
"""


def _custom_code_model(tokenizer, path: str) -> str:
    """A tiny Llama saved as a model with its own code (`auto_map`), as a Hub repo with custom code is."""
    from vcppo_trl.toy.model import build_tiny_model

    build_tiny_model(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    with open(os.path.join(path, "configuration_custom.py"), "w") as f:
        f.write(
            "from transformers import LlamaConfig\n\n\nclass CustomConfig(LlamaConfig):\n"
            "    model_type = 'vcppo-custom-llama'\n"
        )
    with open(os.path.join(path, "modeling_custom.py"), "w") as f:
        f.write(MODELING_CUSTOM)
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["model_type"] = "vcppo-custom-llama"
    config["architectures"] = ["CustomForCausalLM"]
    config["auto_map"] = {
        "AutoConfig": "configuration_custom.CustomConfig",
        "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM",
        "AutoModelForTokenClassification": "modeling_custom.CustomForTokenClassification",
    }
    with open(config_path, "w") as f:
        json.dump(config, f)
    return path


def test_trust_remote_code_loads_a_policy_and_builds_its_critic_from_its_own_code(tokenizer, tmp_path, monkeypatch):
    from vcppo_trl.models.loading import build_critic, load_policy, load_tokenizer

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    path = _custom_code_model(tokenizer, str(tmp_path / "custom"))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_policy(path, model_init_kwargs=None)
    policy = load_policy(path, model_init_kwargs=None, trust_remote_code=True)
    assert type(policy).__name__ == "CustomForCausalLM"
    loaded_tokenizer = load_tokenizer(None, policy, trust_remote_code=True)
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    critic = build_critic(
        None, policy, loaded_tokenizer, model_init_kwargs=None, deepspeed_config=None, trust_remote_code=True
    )
    assert type(critic).__name__ == "CustomForTokenClassification"
    # model_init_kwargs' own key wins, as in TRL
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_policy(path, model_init_kwargs={"trust_remote_code": False}, trust_remote_code=True)
