"""`cast_lm_head_to_fp32`: the head and its logits in float32 under bf16, on every log-prob path, the on-policy ratio,
copies and checkpoints of a cast model, the PEFT refusal and the config field."""

import copy

import pytest
import torch
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM
from trl import TrlParser

from vcppo_trl import PPOConfig
from vcppo_trl.models import (
    PolicyAndValueModel,
    cast_lm_head_to_fp32,
    create_value_model_from_policy,
    full_logits_logprobs,
    is_fp32_head,
    response_logprobs,
)
from vcppo_trl.models.logprobs import causal_lm_parts
from vcppo_trl.models.policy_and_value import position_ids_from_mask
from vcppo_trl.sampling.vllm_checks import vllm_dtype

CONTEXT = 5
TEMPERATURE = 0.7
VOCAB = 300


def tiny_lm(tied=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(config).eval()
    # Larger head weights than the default init, so bf16 rounding of the logits is visible in the log-probs.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)
    return model.to(dtype)


def batch(batch_size=3, response_length=7, seed=1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (batch_size, CONTEXT + response_length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0
    input_ids[attention_mask == 0] = 0
    return input_ids, attention_mask


def bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def logprobs_of(model, path, input_ids, attention_mask):
    """Response log-probs on the chunked (`response_logprobs`) or full-logits path."""
    fn = response_logprobs if path == "chunked" else full_logits_logprobs
    return fn(
        model,
        input_ids,
        attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        context_length=CONTEXT,
        temperature=TEMPERATURE,
    )[0]


def fp32_head_reference(model, input_ids, attention_mask):
    """The log-probs of a float32 projection of the (autocast) backbone's hidden states, computed by hand."""
    hidden = model.model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).last_hidden_state[:, CONTEXT - 1 : -1]
    head = model.get_output_embeddings()
    with torch.autocast("cpu", enabled=False):
        logits = hidden.float() @ head.weight.float().t() / TEMPERATURE
        return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, CONTEXT:, None]).squeeze(-1)


@pytest.mark.parametrize("tied", [True, False])
def test_cast_head_weight_and_logits_are_fp32_in_a_bf16_model(tied):
    model = tiny_lm(tied=tied, dtype=torch.bfloat16)
    cast_lm_head_to_fp32(model)
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight.dtype == torch.float32 and is_fp32_head(head)
    # Tied: one matrix, now float32; the embeddings' output keeps the model's dtype (TRL's hook). Untied: left alone.
    assert (embeddings.weight is head.weight) == tied
    assert embeddings.weight.dtype == (torch.float32 if tied else torch.bfloat16)
    input_ids, attention_mask = batch()
    assert embeddings(input_ids).dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    assert hidden.dtype == torch.bfloat16 and logits.dtype == torch.float32
    torch.testing.assert_close(logits, hidden.float() @ head.weight.t(), rtol=0, atol=0)


def test_logits_stay_fp32_under_bf16_autocast():
    model = tiny_lm()
    input_ids, attention_mask = batch()
    with torch.no_grad(), bf16_autocast():
        assert model(input_ids=input_ids, attention_mask=attention_mask).logits.dtype == torch.bfloat16
        cast_lm_head_to_fp32(model)
        assert model(input_ids=input_ids, attention_mask=attention_mask).logits.dtype == torch.float32


@pytest.mark.parametrize("path", ["chunked", "full"])
def test_every_logprob_path_projects_in_fp32_under_bf16_autocast(path):
    """Both paths equal a hand-made float32 projection of the bf16 backbone's states with the flag; not without."""
    model = tiny_lm()
    input_ids, attention_mask = batch()
    with torch.no_grad(), bf16_autocast():
        reference = fp32_head_reference(model, input_ids, attention_mask)
        before = logprobs_of(model, path, input_ids, attention_mask)
        cast_lm_head_to_fp32(model)
        assert causal_lm_parts(model).fp32_head
        after = logprobs_of(model, path, input_ids, attention_mask)
    assert (before - reference).abs().max() > 1e-3  # bf16 logits: the gap the flag removes
    torch.testing.assert_close(after, reference, rtol=1e-5, atol=1e-5)


def test_on_policy_ratio_is_exactly_one_with_the_flag_under_bf16():
    """The rollout's no-grad forward (old log-probs) and the learner's forward (with grad) of the same batch, both
    through `PolicyAndValueModel` under bf16 autocast: identical log-probs, so a ratio of exactly 1."""
    policy = tiny_lm()
    critic = create_value_model_from_policy(policy)
    cast_lm_head_to_fp32(policy)
    model = PolicyAndValueModel(policy, critic)
    input_ids, attention_mask = batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, context_length=CONTEXT, temperature=TEMPERATURE)
    with bf16_autocast():
        with torch.no_grad():
            old, _, _ = model(**inputs, compute_entropy=False)
        new, entropy, _ = model(**inputs)
    assert new.requires_grad and new.dtype == torch.float32
    ratio = torch.exp(new - old)
    assert torch.equal(ratio, torch.ones_like(ratio))
    (-(ratio.mean() + entropy.mean())).backward()
    assert policy.get_output_embeddings().weight.grad.dtype == torch.float32


def test_a_copy_of_a_cast_model_projects_with_its_own_head():
    """The reference built by `copy.deepcopy(policy)`: its head's forward reads the copy's weight, not the policy's."""
    policy = tiny_lm(tied=False)
    cast_lm_head_to_fp32(policy)
    reference = copy.deepcopy(policy)
    assert is_fp32_head(reference.get_output_embeddings())
    with torch.no_grad():
        policy.get_output_embeddings().weight.zero_()
        input_ids, attention_mask = batch()
        logits = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    assert logits.abs().max() > 0


def test_a_rollout_workers_copy_keeps_the_cast():
    """The HF rollout worker's copy (`sampling_copy`, pickled to a spawned process): float32 logits, and with tied bf16
    embeddings the backbone still gets bf16 inputs (the dtype hook is kept, training hooks are not)."""
    import pickle

    from vcppo_trl.sampling.worker import sampling_copy

    policy = tiny_lm(tied=True, dtype=torch.bfloat16)
    cast_lm_head_to_fp32(policy)
    policy.get_input_embeddings().register_forward_hook(lambda module, args, output: output)  # a training hook
    copy_ = pickle.loads(pickle.dumps(sampling_copy(policy)))
    assert is_fp32_head(copy_.get_output_embeddings())
    assert len(copy_.get_input_embeddings()._forward_hooks) == 1
    input_ids, attention_mask = batch()
    with torch.no_grad():
        assert copy_.get_input_embeddings()(input_ids).dtype == torch.bfloat16
        logits = copy_(input_ids=input_ids, attention_mask=attention_mask).logits
        expected = policy(input_ids=input_ids, attention_mask=attention_mask).logits
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


def test_saved_head_is_fp32(tmp_path):
    model = tiny_lm(tied=False, dtype=torch.bfloat16)
    cast_lm_head_to_fp32(model)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("lm_head.weight").dtype == torch.float32
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16


def test_vllm_dtype_ignores_the_cast_head():
    model = tiny_lm(tied=True, dtype=torch.bfloat16)
    cast_lm_head_to_fp32(model)
    assert next(model.parameters()).dtype == torch.float32  # the tied embedding comes first
    assert vllm_dtype(None, model) == "bfloat16"


@pytest.mark.parametrize("peft_field", ["target_modules", "modules_to_save"])
def test_peft_adapter_on_lm_head_is_refused(peft_field):
    peft = pytest.importorskip("peft")
    kwargs = {"target_modules": ["q_proj", "lm_head"]}
    if peft_field == "modules_to_save":
        kwargs = {"target_modules": ["q_proj"], "modules_to_save": ["lm_head"]}
    policy = peft.get_peft_model(tiny_lm(tied=False), peft.LoraConfig(r=4, **kwargs))
    with pytest.raises(ValueError, match="lm_head.*Remove `lm_head`.*cast_lm_head_to_fp32=False"):
        cast_lm_head_to_fp32(policy)


def test_peft_adapter_elsewhere_is_cast():
    peft = pytest.importorskip("peft")
    policy = peft.get_peft_model(tiny_lm(tied=False), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    cast_lm_head_to_fp32(policy)
    assert is_fp32_head(policy.get_base_model().get_output_embeddings())


def test_trainer_refuses_lora_on_lm_head_with_the_flag(make_trainer, tiny_config):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match="cast_lm_head_to_fp32=True` is not supported"):
        make_trainer(args=tiny_config(cast_lm_head_to_fp32=True), peft_config=config)


def test_config_field_default_help_and_parser(tmp_path):
    assert PPOConfig(output_dir=str(tmp_path), use_cpu=True).cast_lm_head_to_fp32 is False
    parser = TrlParser((PPOConfig,))
    assert "--cast_lm_head_to_fp32" in parser.format_help()
    assert "float32" in PPOConfig.__dataclass_fields__["cast_lm_head_to_fp32"].metadata["help"]
    assert "cast_lm_head_to_fp32 (`bool`, defaults to `False`)" in PPOConfig.__doc__
    (args,) = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--cast_lm_head_to_fp32", "true"]
    )
    assert args.cast_lm_head_to_fp32 is True


@pytest.mark.parametrize("tied", [True, False])
def test_fsdp2_under_bf16_gathers_the_float32_head_in_float32(gloo_world_of_one, tied):
    """FSDP2 with a bf16 policy (accelerate's for `mixed_precision: bf16`): the decoder layers compute in bf16 and the
    cast head in float32 from its float32 weights, on the full-logits and the chunked path alike. Without the head
    unit's own policy, FSDP2 would gather the head in bf16 too."""
    from types import SimpleNamespace

    from trl.trainer.utils import selective_log_softmax

    from vcppo_trl.parallel.fsdp import shard_with_fsdp2

    model = tiny_lm(tied=tied)
    cast_lm_head_to_fp32(model)
    head_weight = model.get_output_embeddings().weight.detach().clone()
    accelerator = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=None),
        mixed_precision="bf16",
        is_main_process=True,
        device=torch.device("cpu"),
    )
    shard_with_fsdp2(accelerator, [model])
    seen = {}

    def see_head(module, args):  # the first call's (the chunked path calls the head on no position)
        seen.setdefault("head", (module.weight.dtype, args[0]))

    model.get_output_embeddings().register_forward_pre_hook(see_head)
    model.model.layers[0].self_attn.q_proj.register_forward_pre_hook(
        lambda module, args: seen.update(layer=module.weight.dtype)
    )
    input_ids, attention_mask = batch()
    positions = position_ids_from_mask(attention_mask)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
        chunked, _ = response_logprobs(model, input_ids, attention_mask, positions, CONTEXT, TEMPERATURE)
    head_dtype, hidden = seen["head"]
    assert seen["layer"] == torch.bfloat16 and head_dtype == torch.float32
    torch.testing.assert_close(logits, hidden.float() @ head_weight.t(), rtol=0, atol=0)
    expected = selective_log_softmax(logits[:, CONTEXT - 1 : -1] / TEMPERATURE, input_ids[:, CONTEXT:])
    torch.testing.assert_close(chunked, expected, rtol=1e-5, atol=1e-5)
