"""Advantage estimators by name (`algo/advantages.py`): TRL's group baselines exactly, the registry, GAE unchanged.

`group_advantages` is checked against TRL's own lines, run as TRL ships them: the block of
`GRPOTrainer._generate_and_score_completions` (trl/trainer/grpo_trainer.py, TRL 1.16.0, from
`unscorable_mask = ...` to `advantages = torch.nan_to_num(...)`) and the same block of
`RLOOTrainer._generate_and_score_completions` (trl/trainer/rloo_trainer.py), cut out of the installed source with
`inspect` and executed on the same scores. A TRL release that changes those lines fails here first.
"""

from __future__ import annotations

import inspect
import textwrap
import types

import pytest
import torch
from trl import GRPOTrainer, RLOOTrainer
from trl.trainer.utils import nanstd as trl_nanstd

from vcppo_trl import PPOConfig, VCPPOConfig, register_advantage_estimator
from vcppo_trl.algo import AdvantageInputs, Advantages, advantage_estimator_names, dual_lambda_gae, group_advantages
from vcppo_trl.algo.advantages import _REGISTRY, get_advantage_estimator, nanstd

from ..builders import tiny_config

START = "unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)"
END = "advantages = torch.nan_to_num(advantages, nan=0.0)"


def trl_block(trainer_class) -> str:
    """TRL's advantage lines of `trainer_class._generate_and_score_completions`, dedented."""
    source = inspect.getsource(trainer_class._generate_and_score_completions)
    start, end = source.index(START), source.index(END) + len(END)
    line_start = source.rindex("\n", 0, start) + 1
    return textwrap.dedent(source[line_start:end])


def trl_advantages(
    trainer_class,
    rewards_per_func: torch.Tensor,
    num_generations: int,
    *,
    beta: float = 0.0,
    logprobs: dict[str, torch.Tensor] | None = None,
    **attributes,
) -> torch.Tensor:
    """TRL's advantages of one reward function's scores (weight 1), by running its lines; `attributes` are the
    trainer's (`scale_rewards`, `normalize_advantages`), `logprobs` RLOO's `old_per_token_logps`,
    `ref_per_token_logps` and `completion_mask` when `beta` > 0."""
    trainer = types.SimpleNamespace(
        reward_weights=torch.ones(rewards_per_func.shape[1]),
        reward_funcs=[None] * rewards_per_func.shape[1],
        multi_objective_aggregation="sum_then_normalize",
        reward_clip_range=None,
        beta=beta,
        **attributes,
    )
    namespace = {
        "torch": torch,
        "nanstd": trl_nanstd,
        "self": trainer,
        "rewards_per_func": rewards_per_func,
        "num_generations": num_generations,
        "device": rewards_per_func.device,
        "gather": lambda t: t,  # one process
        **(logprobs or {}),
    }
    exec(trl_block(trainer_class), namespace)
    return namespace["advantages"]


def scores_with_gaps(seed: int, n: int, *, unscored: float = 0.15, ties: bool = False) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=generator)
    if ties:
        scores = torch.where(torch.rand(n, generator=generator) < 0.5, 1.0, -1.0)
    return torch.where(torch.rand(n, generator=generator) < unscored, float("nan"), scores)


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none", True, False])
@pytest.mark.parametrize("ties", [False, True])
def test_grpo_advantages_are_trls_exactly(scale_rewards, ties):
    for seed in range(5):
        scores = scores_with_gaps(seed, 32, ties=ties)
        scale = {True: "group", False: "none"}.get(scale_rewards, scale_rewards)  # GRPOConfig.__post_init__
        expected = trl_advantages(GRPOTrainer, scores.unsqueeze(1), 4, scale_rewards=scale)
        ours = group_advantages(scores, 4, estimator="grpo", scale_rewards=scale_rewards)
        assert torch.equal(ours, expected), seed
        assert torch.equal(ours[torch.isnan(scores)], torch.zeros(int(torch.isnan(scores).sum())))


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("num_generations", [2, 4, 8])
def test_rloo_advantages_are_trls_exactly(normalize, num_generations):
    for seed in range(5):
        scores = scores_with_gaps(seed, 32, unscored=0.25)
        expected = trl_advantages(RLOOTrainer, scores.unsqueeze(1), num_generations, normalize_advantages=normalize)
        ours = group_advantages(scores, num_generations, estimator="rloo", normalize=normalize)
        assert torch.equal(ours, expected), seed


def test_rloo_takes_the_summed_kl_from_the_reward_before_its_baseline_as_trl():
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(8, generator=generator)
    old, ref = torch.randn(8, 5, generator=generator), torch.randn(8, 5, generator=generator)
    mask = torch.ones(8, 5)
    mask[:, 3:] = 0
    beta = 0.1
    logprobs = {"old_per_token_logps": old, "ref_per_token_logps": ref, "completion_mask": mask}
    expected = trl_advantages(
        RLOOTrainer, scores.unsqueeze(1), 4, beta=beta, logprobs=logprobs, normalize_advantages=False
    )
    inputs = AdvantageInputs(
        rewards=torch.zeros(8, 5),
        values=None,
        response_mask=mask.bool(),
        scores=scores,
        kl_sums=((old - ref) * mask).sum(1),  # the rollout's k1 KL on the policy's tokens, summed
        local_rows=slice(0, 8),
        num_generations=4,
        kl_coef=beta,
    )
    out = get_advantage_estimator("rloo").function(inputs)
    assert torch.allclose(out.advantages[:, 0], expected, atol=1e-6, rtol=0)
    assert out.returns is None


def test_nanstd_is_trls():
    for seed in range(4):
        x = scores_with_gaps(seed, 24).view(6, 4)
        assert torch.equal(nanstd(x, dim=1), trl_nanstd(x, dim=1))
        assert torch.equal(nanstd(x.flatten()), trl_nanstd(x.flatten()))


def test_a_sequence_advantage_reaches_every_policy_token_and_no_other():
    scores = torch.tensor([1.0, -1.0, 1.0, 1.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]).bool()
    actions = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 0, 1], [1, 1, 1, 1]]).bool()
    inputs = AdvantageInputs(
        rewards=torch.zeros(4, 4),
        values=None,
        response_mask=mask,
        action_mask=actions,
        scores=scores,
        local_rows=slice(0, 4),
        num_generations=2,
    )
    out = get_advantage_estimator("grpo").function(inputs)
    per_response = group_advantages(scores, 2)
    assert torch.equal(out.advantages, per_response.unsqueeze(1) * (mask & actions).float())
    assert out.returns is None


def test_the_local_rows_of_a_batch_gathered_from_every_process():
    scores = scores_with_gaps(1, 16, unscored=0.0)
    mask = torch.ones(8, 3, dtype=torch.bool)
    inputs = AdvantageInputs(
        rewards=torch.zeros(8, 3),
        values=None,
        response_mask=mask,
        scores=scores,
        local_rows=slice(8, 16),  # the second process's rows
        num_generations=4,
        scale_rewards="batch",
    )
    out = get_advantage_estimator("grpo").function(inputs)
    assert torch.equal(out.advantages[:, 0], group_advantages(scores, 4, scale_rewards="batch")[8:])


def test_gae_by_name_is_dual_lambda_gae():
    generator = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(4, 6, generator=generator), torch.randn(4, 6, generator=generator)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    inputs = AdvantageInputs(
        rewards=rewards,
        values=values,
        response_mask=mask,
        scores=torch.zeros(4),
        local_rows=slice(0, 4),
        num_generations=1,
        gamma=1.0,
        lam_actor=0.95,
        lam_critic=1.0,
    )
    out = get_advantage_estimator("gae").function(inputs)
    advantages, returns = dual_lambda_gae(rewards, values, mask, gamma=1.0, lam_actor=0.95, lam_critic=1.0)
    assert torch.equal(out.advantages, advantages) and torch.equal(out.returns, returns)
    with pytest.raises(ValueError, match="needs the critic's values"):
        get_advantage_estimator("gae").function(AdvantageInputs(**{**inputs.__dict__, "values": None}))


@pytest.mark.parametrize(
    "scores, num_generations, kwargs, message",
    [
        (torch.zeros(8), 1, {}, "num_generations >= 2"),
        (torch.zeros(6), 4, {}, "multiple of num_generations"),
        (torch.zeros(8), 4, {"estimator": "ppo"}, "must be one of"),
        (torch.zeros(8), 4, {"scale_rewards": "max"}, "scale_rewards"),
    ],
)
def test_group_advantages_refuses_bad_input(scores, num_generations, kwargs, message):
    with pytest.raises(ValueError, match=message):
        group_advantages(scores, num_generations, **kwargs)


def test_an_estimator_of_ones_own_is_picked_by_name(tmp_path):
    @register_advantage_estimator("best_of_group_test", uses_critic=False)
    def best_of_group(inputs: AdvantageInputs) -> Advantages:
        scores = inputs.scores.nan_to_num(float("-inf")).view(-1, inputs.num_generations)
        best = (scores == scores.max(dim=1, keepdim=True).values).float().view(-1)[inputs.local_rows]
        return Advantages(best.unsqueeze(1) * inputs.action_tokens)

    try:
        assert "best_of_group_test" in advantage_estimator_names()
        estimator = get_advantage_estimator("best_of_group_test")
        assert not estimator.uses_critic and not estimator.whiten and estimator.reads_scores
        config = tiny_config(tmp_path, advantage_estimator="best_of_group_test", num_generations=2)
        assert not config.uses_critic
        with pytest.raises(ValueError, match="already registered"):
            register_advantage_estimator("best_of_group_test")(best_of_group)
    finally:
        _REGISTRY.pop("best_of_group_test")


@pytest.mark.parametrize(
    "cls, fields, message",
    [
        (PPOConfig, {"advantage_estimator": "a2c"}, "Unknown advantage_estimator 'a2c': choose one of 'gae', 'grpo'"),
        (PPOConfig, {"advantage_estimator": "grpo", "num_generations": 1}, "needs num_generations >= 2"),
        (PPOConfig, {"advantage_estimator": "rloo", "num_generations": 1}, "needs num_generations >= 2"),
        (
            PPOConfig,
            {"advantage_estimator": "grpo", "num_generations": 2, "generation_window": 4},
            "does not combine with generation_window",
        ),
        (PPOConfig, {"scale_rewards": "batch"}, "advantage_estimator='gae' makes none"),
        (PPOConfig, {"scale_rewards": "max", "advantage_estimator": "grpo", "num_generations": 2}, "`scale_rewards`"),
        (
            PPOConfig,
            {"normalize_advantages": True, "advantage_estimator": "grpo", "num_generations": 2},
            "normalises TRL RLOO's",
        ),
        (PPOConfig, {"advantage_estimator": "rloo", "num_generations": 2, "whiten_rewards": True}, "whiten_rewards"),
        (
            PPOConfig,
            {"advantage_estimator": "rloo", "num_generations": 2, "value_peft_config": {"r": 4}},
            "value_peft_config",
        ),
        (
            VCPPOConfig,
            {"advantage_estimator": "grpo", "num_generations": 2, "value_pretrain_steps": 5},
            "builds no critic, so value_pretrain_steps",
        ),
        (
            VCPPOConfig,
            {"advantage_estimator": "grpo", "num_generations": 2, "value_model_path": "critic"},
            "builds no critic, so value_model_path",
        ),
    ],
)
def test_the_config_refuses_what_an_estimator_cannot_use(tmp_path, cls, fields, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, cls, **fields)


def test_trls_names_and_defaults(tmp_path):
    grpo = tiny_config(tmp_path, PPOConfig, advantage_estimator="grpo", num_generations=2, scale_rewards=False)
    assert (grpo.scale_rewards, grpo.kl_coef) == ("none", 0.0)  # GRPO's beta default
    assert tiny_config(tmp_path, PPOConfig, advantage_estimator="grpo", num_generations=2, beta=0.04).kl_coef == 0.04
    assert tiny_config(tmp_path, PPOConfig, advantage_estimator="rloo", num_generations=2).kl_coef == 0.05  # RLOO's
    assert tiny_config(tmp_path, PPOConfig).kl_coef == 0.05  # TRL PPO's
    assert tiny_config(tmp_path, VCPPOConfig).kl_coef == 0.0  # the paper's
    # value_pretrain_steps=0 says "no pretraining", which a run without a critic may say
    config = tiny_config(tmp_path, VCPPOConfig, advantage_estimator="rloo", num_generations=2, value_pretrain_steps=0)
    assert not config.uses_critic and tiny_config(tmp_path).uses_critic
    assert set(advantage_estimator_names()) >= {"gae", "grpo", "rloo"}
