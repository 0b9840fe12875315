"""One rank of a 2-process FSDP2 run whose models are loaded from a directory, launched by test_distributed.py with
configs/accelerate/fsdp2_cpu.yaml and `--fsdp_cpu_ram_efficient_loading true`:

    accelerate launch --config_file configs/accelerate/fsdp2_cpu.yaml --fsdp_cpu_ram_efficient_loading true \
        tests/integration/distributed/loading_worker.py OUT MODEL_DIR

The trainer loads the policy from MODEL_DIR (transformers 5 reads the checkpoint on every rank, on CPU), builds the
critic from it (a fresh value head) and the reference (a copy of the policy, `kl_coef > 0`), and shards each
(accelerate moves rank 1's copy to `meta` and broadcasts rank 0's weights into the shards). Rank 1 spoils its own
copies before sharding, so that only that broadcast gives the checkpoint's weights. Each rank records the devices its
policy and critic were built on and the full weights of the three sharded models (gathered on every rank), then one
update trains. Rank 0 writes `OUT/loading.json`: those devices, whether both ranks' full weights are equal, whether
they equal a plain load of MODEL_DIR on one process, and the update's losses.
"""

from __future__ import annotations

import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of a sharded model, gathered on every rank (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {name: tensor.detach().clone() for name, tensor in state.items()}


def main(out_dir: str, model_dir: str) -> None:
    from accelerate.utils import gather_object
    from common import parity_reward, tiny_splits, tiny_tokenizer, worker_config  # beside this script
    from transformers import AutoModelForCausalLM
    from worker_exit import exit_worker  # beside this script

    import vcppo_trl.trainer.model_setup as setup
    from vcppo_trl import PPOConfig, PPOTrainer

    built_on = {}  # the devices each model's parameters were built on, before sharding
    head = [None]  # the critic's new value head as rank 0 built it

    def spoil(model):
        """On rank 1, its own copy of the weights made wrong before sharding: with low-memory loading only rank 0's
        weights may reach the shards (transformers 5 reads the checkpoint on every rank, and a new value head may be
        initialised differently on each)."""
        if int(os.environ.get("RANK", "0")) != 0:
            with torch.no_grad():
                for p in model.parameters():
                    if p.device.type != "meta":
                        p.add_(1.0)

    load_policy, build_critic = setup.load_policy, setup.build_critic

    def recording_load_policy(*args, **kwargs):
        policy = load_policy(*args, **kwargs)
        built_on["policy"] = sorted({p.device.type for p in policy.parameters()})
        spoil(policy)  # the critic's backbone and the reference are copied from it
        return policy

    def recording_build_critic(*args, **kwargs):
        critic = build_critic(*args, **kwargs)
        built_on["critic"] = sorted({p.device.type for p in critic.parameters()})
        head[0] = {k: t.detach().clone() for k, t in critic.state_dict().items() if not k.startswith("model.")}
        spoil(critic)
        return critic

    weights = {}  # the full weights of each model once sharded, on every rank
    prepare_for_training = setup.prepare_for_training

    def recording_prepare_for_training(accelerator, model, **kwargs):  # where `train` shards the policy and critic
        prepared = prepare_for_training(accelerator, model, **kwargs)
        weights.update(policy=full_weights(model.policy), critic=full_weights(model.critic))
        return prepared

    setup.load_policy, setup.build_critic = recording_load_policy, recording_build_critic
    setup.prepare_for_training = recording_prepare_for_training

    args = worker_config(
        PPOConfig,
        out_dir,
        use_cpu=True,  # FSDP2 over gloo
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        total_episodes=4,  # one update: 2 prompts on each of the 2 ranks
        response_length=8,
        lam=0.95,
        kl_coef=0.05,  # a reference model
        logging_steps=1,
    )
    train = tiny_splits(16, 4, max_digits=2)["train"]
    trainer = PPOTrainer(model_dir, parity_reward, args=args, train_dataset=train, processing_class=tiny_tokenizer())
    acc = trainer.accelerator
    weights["reference"] = full_weights(trainer.ref_model)  # sharded when the trainer is built
    trainer.train()
    models = {"policy": trainer.model.policy, "critic": trainer.model.critic, "reference": trainer.ref_model}
    sharded_on = sorted({p.device.type for m in models.values() for p in m.parameters()})
    losses = [v for row in trainer.state.log_history for k, v in row.items() if k.startswith("loss/")]
    every_rank = gather_object([{"built_on": built_on, "sharded_on": sharded_on, "weights": weights, "head": head[0]}])
    if acc.is_main_process:
        mine, other = every_rank
        plain = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        result = {
            "built_on": [r["built_on"] for r in every_rank],
            "sharded_on": [r["sharded_on"] for r in every_rank],
            # every weight of every model equal on both ranks, the critic's new value head included
            "ranks_agree": {
                name: sorted(mine["weights"][name]) == sorted(other["weights"][name])
                and all(torch.equal(t, other["weights"][name][k]) for k, t in mine["weights"][name].items())
                for name in models
            },
            # the policy and the reference equal the checkpoint, the critic's backbone equals the policy's
            "policy_equals_checkpoint": all(torch.equal(t, plain[k]) for k, t in mine["weights"]["policy"].items()),
            "reference_equals_checkpoint": all(
                torch.equal(t, plain[k]) for k, t in mine["weights"]["reference"].items()
            ),
            "critic_backbone_equals_checkpoint": all(
                torch.equal(t, plain[k]) for k, t in mine["weights"]["critic"].items() if k.startswith("model.")
            ),
            # the new value head: rank 0's, on both ranks (and not all zeros)
            "critic_head_is_rank_0s": all(
                torch.equal(mine["weights"]["critic"][k], t) for k, t in mine["head"].items()
            ),
            "critic_head_sum": sum(float(t.abs().sum()) for t in mine["head"].values()),
            "losses": losses,
            "finite_losses": bool(losses) and all(math.isfinite(v) for v in losses),
        }
        with open(os.path.join(out_dir, "loading.json"), "w") as f:
            json.dump(result, f)
    exit_worker(acc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
