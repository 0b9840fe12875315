"""Two processes on CPU (gloo): DDP through accelerate, and DeepSpeed ZeRO-3. Each rank runs worker.py (beside it)."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest

from ...paths import (
    ADVANTAGE_WORKER,
    BALANCE_WORKER,
    GRAD_WORKER,
    LOADING_WORKER,
    REPO,
    ROLLOUT_FUNC_WORKER,
    SP_ROLLOUT_WORKER,
    TOOL_OVERLAP_WORKER,
    TOOLS_WORKER,
    WORKER,
)


def _clean_env(extra_env=None) -> dict:
    """This environment less any launcher's variables, with one thread per process and the package on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRL_EXPERIMENTAL_SILENCE="1",
        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), env.get("PYTHONPATH", "")]),
    )
    env.update(extra_env or {})
    return env


def _launch(out_dir, launcher, extra_env=None, worker_args=(), timeout=240):
    cmd = [sys.executable, "-m", *launcher, WORKER, str(out_dir), *worker_args]
    proc = subprocess.run(cmd, env=_clean_env(extra_env), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.load(open(out_dir / f"rank{r}.json")) for r in (0, 1)]


TORCHRUN = ["torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
CPU = {"ACCELERATE_USE_CPU": "1"}


def _launcher(launcher: str) -> tuple[list[str], dict]:
    """The `python -m` command that starts 2 processes, and the environment it needs: "ddp" (torchrun on CPU), "fsdp2"
    (accelerate launch with configs/accelerate/fsdp2_cpu.yaml) or "zero3" (with configs/accelerate/zero3_cpu.yaml)."""
    if launcher == "ddp":
        return TORCHRUN, CPU
    if launcher == "zero3":
        pytest.importorskip("deepspeed")
    config = os.path.join(REPO, f"configs/accelerate/{launcher}_cpu.yaml")
    return ["accelerate.commands.accelerate_cli", "launch", "--config_file", config, "--main_process_port", "0"], {}


def _run_worker(worker: str, launcher: str, args: list[str], timeout: int = 240, launch_args=()) -> None:
    """`worker` (a script beside this file) on 2 processes started by `launcher` (see [`_launcher`]), with
    `launch_args` added to the launcher's."""
    launch, extra_env = _launcher(launcher)
    cmd = [sys.executable, "-m", *launch, *launch_args, worker, *args]
    proc = subprocess.run(cmd, env=_clean_env(extra_env), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _launch_two(out_dir, launcher: str, overrides: dict, extra_env: dict | None = None) -> list[dict]:
    """worker.py on two processes with `overrides` (and `extra_env`): "ddp" (torchrun on CPU), "fsdp2" (accelerate
    launch with configs/accelerate/fsdp2_cpu.yaml over gloo), or else ZeRO-3 (accelerate launch with
    configs/accelerate/zero3_cpu.yaml over gloo, generation sharded)."""
    launch, env = _launcher("zero3" if launcher not in ("ddp", "fsdp2") else launcher)
    if launcher == "fsdp2":
        overrides = overrides | {"use_cpu": True}
    elif launcher != "ddp":
        overrides = overrides | {"ddp_backend": "gloo", "ds3_gather_for_generation": False}
    return _launch(out_dir, launch, extra_env=env | (extra_env or {}), worker_args=[json.dumps(overrides)])


def test_ddp_two_processes_on_cpu(tmp_path):
    ranks = _launch(tmp_path, TORCHRUN, extra_env=CPU)
    r0, r1 = ranks
    for r, info in enumerate(ranks):
        assert info["rank"] == r
        assert info["num_processes"] == 2 and info["torch_world_size"] == 2
        assert info["distributed_type"] == "DistributedType.MULTI_CPU"
        assert info["batch_size"] == 16 and info["global_step"] == 3  # 1 value-pretraining + 2 PPO updates

    # Prompts are sharded without overlap: 3 updates × 8 prompts per rank, 48 distinct rows of the 64.
    seen0 = [i for update in r0["seen"] for i in update]
    seen1 = [i for update in r1["seen"] for i in update]
    assert len(seen0) == len(seen1) == 24
    assert len(set(seen0) | set(seen1)) == 48
    # Each rank samples its own responses (rank-offset sampling seed).
    assert r0["completions"] != r1["completions"]

    # Metrics are gathered over both ranks: the logged mean score is the mean over all 16 responses of an update.
    for update, (m0, m1) in enumerate(zip(r0["metrics"], r1["metrics"])):
        m0, m1 = ({k: v for k, v in m.items() if not k.startswith("time/")} for m in (m0, m1))
        assert m0 == pytest.approx(m1, nan_ok=True)
        everything = r0["rewards"][update] + r1["rewards"][update]
        assert m0["objective/scores"] == pytest.approx(sum(everything) / len(everything))
    assert "value_pretrain/explained_variance" in r0["metrics"][0]
    assert "loss/policy_avg" in r0["metrics"][-1]
    for info in (r0, r1):  # the frozen policy got no gradient and no optimizer state in pretraining
        assert info["optimizer_after_pretraining"]["policy"] == {"steps": 0.0, "moments": 0.0, "state_tensors": 0.0}
        assert info["optimizer_after_pretraining"]["value"]["steps"] == 2.0

    # Weights are identical on both ranks after the updates, and the saved policy and critic load.
    assert r0["policy_hash"] == r1["policy_hash"]
    assert r0["critic_hash"] == r1["critic_hash"]
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    AutoModelForTokenClassification.from_pretrained(tmp_path / "model" / "value_model")


def _state_hash(model):
    sys.path.insert(0, os.path.dirname(WORKER))
    try:
        from worker import state_hash
    finally:
        sys.path.pop(0)
    return state_hash(model)


@pytest.mark.parametrize("gather", [True, False], ids=["gathered-generation", "sharded-generation"])
def test_zero3_two_processes_on_cpu(tmp_path, gather):
    pytest.importorskip("deepspeed")
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    launch = [
        "accelerate.commands.accelerate_cli",
        "launch",
        "--config_file",
        os.path.join(REPO, "configs/accelerate/zero3_cpu.yaml"),
    ]
    launch += ["--main_process_port", "0"]
    overrides = {"ddp_backend": "gloo", "weight_decay": 0.1, "ds3_gather_for_generation": gather}
    r0, r1 = _launch(tmp_path, launch, worker_args=[json.dumps(overrides)])
    for r, info in enumerate((r0, r1)):
        assert info["rank"] == r
        assert info["distributed_type"] == "DistributedType.DEEPSPEED"
        assert info["num_processes"] == info["torch_world_size"] == 2  # accelerate sees both ranks
        assert info["global_step"] == 3 and info["batch_size"] == 16
        # Parameters are partitioned: each rank holds about half of the policy and of the critic.
        for counts in (info["policy_params"], info["critic_params"]):
            assert counts["local"] < counts["total"] <= 2 * counts["local"]

    seen0 = {i for update in r0["seen"] for i in update}
    seen1 = {i for update in r1["seen"] for i in update}
    assert len(seen0) == len(seen1) == 24 and not seen0 & seen1
    for update, (m0, m1) in enumerate(zip(r0["metrics"], r1["metrics"])):
        everything = r0["rewards"][update] + r1["rewards"][update]
        assert m0["objective/scores"] == m1["objective/scores"] == pytest.approx(sum(everything) / len(everything))

    # Value pretraining leaves the policy bit-identical under ZeRO-3 too (weight decay on), then PPO moves it.
    assert r0["after_pretraining"]["policy"] == r0["initial_policy_hash"]
    # ...and PPO starts from a fresh policy optimizer state, as without DeepSpeed: ZeRO gives the frozen policy zero
    # gradients, on which Adam's step count would advance through pretraining and mis-scale the first PPO steps.
    for info in (r0, r1):
        assert info["optimizer_after_pretraining"]["policy"] == {"steps": 0.0, "moments": 0.0, "state_tensors": 0.0}
        assert info["optimizer_after_pretraining"]["value"]["steps"] == 2.0  # 1 update × 2 mini-batches
    assert r0["policy_hash"] != r0["initial_policy_hash"]
    assert r0["critic_hash"] != r0["after_pretraining"]["critic"]
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])

    # The consolidated 16-bit safetensors load with from_pretrained and hold the trained (gathered) weights.
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    critic = AutoModelForTokenClassification.from_pretrained(tmp_path / "model" / "value_model")
    assert _state_hash(policy) == r0["policy_hash"]
    assert _state_hash(critic) == r0["critic_hash"]
    # So does the critic saved right after value pretraining (gathered from its partitions).
    pretrained = AutoModelForTokenClassification.from_pretrained(tmp_path / "run" / "value_pretrained")
    assert _state_hash(pretrained) == r0["after_pretraining"]["critic"]


def test_ddp_resume_equals_uninterrupted_run(tmp_path):
    """Two ranks stopped after update 2 and resumed end with the weights of an uninterrupted 2-rank run."""
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full_dir.mkdir()
    resumed_dir.mkdir()
    full = _launch(full_dir, TORCHRUN, CPU, worker_args=[json.dumps({"save_strategy": "steps", "save_steps": 1})])
    checkpoint = full_dir / "run" / "checkpoint-2"
    assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    resumed = _launch(
        resumed_dir, TORCHRUN, CPU, worker_args=[json.dumps({"resume_from_checkpoint": str(checkpoint)})]
    )
    for rank in (0, 1):
        assert resumed[rank]["global_step"] == 3
        assert resumed[rank]["seen"] == full[rank]["seen"][2:]  # the same prompts for the update after the stop
        assert resumed[rank]["policy_hash"] == full[rank]["policy_hash"]
        assert resumed[rank]["critic_hash"] == full[rank]["critic_hash"]


def test_ddp_sigterm_stops_both_ranks_at_one_checkpoint(tmp_path):
    """SIGTERM to torchrun (as a scheduler sends it) reaches both ranks; they agree, save one checkpoint, exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(CPU, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=os.path.join(REPO, "src"))
    overrides = json.dumps({"total_episodes": 16000})
    cmd = [sys.executable, "-m", *TORCHRUN, WORKER, str(tmp_path), overrides]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if line.startswith("UPDATE 2 "):
                break
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=120)
        output.append(rest)
    finally:
        process.kill()
    assert process.returncode != 0, "".join(output)[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert ranks[0] == ranks[1]  # both stopped after the same update, naming the same checkpoint
    checkpoint = ranks[0]["interrupted"]
    assert checkpoint.endswith(f"checkpoint-{ranks[0]['global_step']}")
    from vcppo_trl.checkpoint.files import missing_checkpoint_files

    assert missing_checkpoint_files(checkpoint, 2) == []
    assert os.path.isfile(os.path.join(checkpoint, "rng_state_1.pth"))


def test_zero3_resume_equals_uninterrupted_run(tmp_path):
    """Two ZeRO-3 ranks resumed from the DeepSpeed states of update 2 end with the uninterrupted run's weights."""
    pytest.importorskip("deepspeed")
    launch = ["accelerate.commands.accelerate_cli", "launch", "--config_file"]
    launch += [os.path.join(REPO, "configs/accelerate/zero3_cpu.yaml"), "--main_process_port", "0"]
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full_dir.mkdir()
    resumed_dir.mkdir()
    settings = {"ddp_backend": "gloo", "weight_decay": 0.1}
    full = _launch(full_dir, launch, worker_args=[json.dumps({**settings, "save_strategy": "steps", "save_steps": 1})])
    checkpoint = full_dir / "run" / "checkpoint-2"
    assert (checkpoint / "latest").is_file() and list(checkpoint.glob("global_step*/zero_pp_rank_1_*optim_states.pt"))
    resumed = _launch(
        resumed_dir, launch, worker_args=[json.dumps({**settings, "resume_from_checkpoint": str(checkpoint)})]
    )
    for rank in (0, 1):
        assert resumed[rank]["global_step"] == 3
        assert resumed[rank]["seen"] == full[rank]["seen"][2:]
        assert resumed[rank]["policy_hash"] == full[rank]["policy_hash"]
        assert resumed[rank]["critic_hash"] == full[rank]["critic_hash"]


def test_zero3_reference_and_reward_models(tmp_path):
    """With kl_coef > 0 the reference model, and a reward model, run under DeepSpeed ZeRO-3 on both ranks."""
    pytest.importorskip("deepspeed")
    launch = ["accelerate.commands.accelerate_cli", "launch", "--config_file"]
    launch += [os.path.join(REPO, "configs/accelerate/zero3_cpu.yaml"), "--main_process_port", "0"]
    overrides = {"ddp_backend": "gloo", "kl_coef": 0.1, "with_reward_model": True, "reward_weights": [1.0, 1.0, 0.5]}
    r0, r1 = _launch(tmp_path, launch, worker_args=[json.dumps(overrides)])
    assert r0["global_step"] == r1["global_step"] == 3
    ppo = [m for m in r0["metrics"] if "loss/policy_avg" in m]
    assert len(ppo) == 2
    reward_model_keys = [
        k for k in ppo[0] if k.startswith("rewards/") and "length_reward" not in k and "recording" not in k
    ]
    assert len(reward_model_keys) == 1  # the reward model's own mean is logged
    for m0, m1 in zip(r0["metrics"], r1["metrics"]):
        assert m0["objective/scores"] == m1["objective/scores"]
        assert math.isfinite(m0[reward_model_keys[0]]) and m0[reward_model_keys[0]] != 0.0
    # The reference is the initial policy: the KL is 0 on the first PPO update, then the policy has moved.
    assert ppo[0]["objective/kl"] == pytest.approx(0.0, abs=1e-5)
    assert ppo[1]["objective/kl"] != 0.0 and math.isfinite(ppo[1]["objective/kl"])
    assert r0["policy_hash"] == r1["policy_hash"]


def test_zero3_padding_free_forwards_with_a_reference_model(tmp_path):
    """Padding-free forwards under ZeRO-3 with kl_coef > 0: the packing check reads the vocabulary of a reference that
    is a DeepSpeed engine (its own `config` is DeepSpeed's), and the KL is that of the padded run's reference."""
    pytest.importorskip("deepspeed")
    launch = ["accelerate.commands.accelerate_cli", "launch", "--config_file"]
    launch += [os.path.join(REPO, "configs/accelerate/zero3_cpu.yaml"), "--main_process_port", "0"]
    runs = {}
    for padding_free in (True, False):
        overrides = {"ddp_backend": "gloo", "kl_coef": 0.05, "padding_free": padding_free}
        out = tmp_path / f"padding_free_{padding_free}"
        runs[padding_free] = _launch(out, launch, worker_args=[json.dumps(overrides)])
    packed, padded = runs[True][0], runs[False][0]
    assert packed["global_step"] == padded["global_step"] == 3
    kl = [
        (a["objective/kl"], b["objective/kl"])
        for a, b in zip(packed["metrics"], padded["metrics"])
        if "loss/policy_avg" in a
    ]
    assert len(kl) == 2 and kl[1][0] != 0.0
    for packed_kl, padded_kl in kl:
        assert packed_kl == pytest.approx(padded_kl, rel=1e-3, abs=1e-5)


def test_zero3_bf16_with_a_policy_built_before_the_trainer(tmp_path):
    """
    bf16 under ZeRO-3 with a policy created before the trainer (not partitioned): the critic is built unpartitioned
    too, so DeepSpeed casts both to bf16. Building it under zero.Init left the policy fp32 and the critic bf16, and
    DeepSpeed's ZeRO-3 optimizer stopped on the mix (seen first on an H200, benchmarks/results/gpu_check_h200.txt).
    """
    pytest.importorskip("deepspeed")
    launch = ["accelerate.commands.accelerate_cli", "launch", "--config_file"]
    launch += [os.path.join(REPO, "configs/accelerate/zero3_cpu.yaml"), "--main_process_port", "0"]
    launch += ["--mixed_precision", "bf16"]
    overrides = {"ddp_backend": "gloo", "bf16": True, "use_cpu": True}
    r0, r1 = _launch(tmp_path, launch, worker_args=[json.dumps(overrides)])
    assert r0["distributed_type"] == "DistributedType.DEEPSPEED"
    assert r0["global_step"] == r1["global_step"] == 3
    assert r0["policy_hash"] != r0["initial_policy_hash"]
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])


def test_zero3_on_cpu_without_gloo_stops_with_the_fix(tmp_path):
    """Without a ddp_backend, accelerate counts 1 process while DeepSpeed runs 2: the trainer says what to pass."""
    pytest.importorskip("deepspeed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=os.path.join(REPO, "src"))
    launch = ["accelerate.commands.accelerate_cli", "launch", "--config_file"]
    launch += [os.path.join(REPO, "configs/accelerate/zero3_cpu.yaml"), "--main_process_port", "0"]
    cmd = [sys.executable, "-m", *launch, WORKER, str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert "pass `--ddp_backend gloo`" in proc.stdout + proc.stderr


def test_zero3_with_lora_policy_and_critic(tmp_path):
    """LoRA on both models under ZeRO-3 (reference = the policy with its adapter disabled, as KL needs)."""
    pytest.importorskip("deepspeed")
    launch = ["accelerate.commands.accelerate_cli", "launch", "--config_file"]
    launch += [os.path.join(REPO, "configs/accelerate/zero3_cpu.yaml"), "--main_process_port", "0"]
    overrides = {"ddp_backend": "gloo", "lora": True, "kl_coef": 0.1}
    r0, r1 = _launch(tmp_path, launch, worker_args=[json.dumps(overrides)])
    assert r0["global_step"] == r1["global_step"] == 3
    ppo = [m for m in r0["metrics"] if "loss/policy_avg" in m]
    assert ppo[0]["objective/kl"] == pytest.approx(0.0, abs=1e-5) and ppo[1]["objective/kl"] != 0.0
    pretraining = r0["after_pretraining"]
    assert pretraining["policy"] == pretraining["policy_at_start"] != r0["policy_hash"]  # frozen, then trained
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    from peft import PeftConfig

    assert PeftConfig.from_pretrained(tmp_path / "model").peft_type == "LORA"  # the saved policy is an adapter


def test_fsdp2_with_lora_policy_and_critic_trains_saves_and_resumes(tmp_path):
    """LoRA on both models under FSDP2 (each sharded through the model inside its PEFT wrapper, frozen base and
    trainable adapters in the same FSDP groups): the reference is the sharded policy with its adapter disabled (KL 0 on
    the first PPO update), value pretraining leaves the policy bit-identical, the saved policy is an adapter holding
    the trained weights, checkpoints hold the adapters and the shards, and a run resumed from update 2 ends with the
    uninterrupted run's weights bit for bit. Two launches."""
    from peft import PeftConfig, PeftModel

    from vcppo_trl.toy.model import build_tiny_model
    from vcppo_trl.toy.tokenizer import build_tokenizer

    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full_dir.mkdir()
    resumed_dir.mkdir()
    settings = {"lora": True, "kl_coef": 0.1, "weight_decay": 0.1}
    r0, r1 = _launch_two(full_dir, "fsdp2", settings | {"save_strategy": "steps", "save_steps": 1})
    for info in (r0, r1):
        assert info["distributed_type"] == "DistributedType.MULTI_CPU" and info["global_step"] == 3
        for counts in (info["policy_params"], info["critic_params"]):
            assert 0 < counts["local"] < counts["total"]  # base weights and adapters sharded
        assert info["optimizer_after_pretraining"]["policy"] == {"steps": 0.0, "moments": 0.0, "state_tensors": 0.0}
        assert info["optimizer_after_pretraining"]["value"]["steps"] == 2.0
    ppo = [m for m in r0["metrics"] if "loss/policy_avg" in m]
    assert ppo[0]["objective/kl"] == pytest.approx(0.0, abs=1e-5) and ppo[1]["objective/kl"] != 0.0
    pretraining = r0["after_pretraining"]
    assert pretraining["policy"] == pretraining["policy_at_start"] != r0["policy_hash"]  # frozen, then trained
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])  # gathered on each rank
    # vLLM's sync of the LoRA policy (adapters' B set random after saving): each layer's base weight and adapters
    # gathered and merged equal PEFT's merge_adapter on an unsharded copy, names in order, float32 up to rounding.
    lora_sync = r0["vllm_lora"]
    assert lora_sync["names_equal"] and lora_sync["merged_layers"] == 2 and lora_sync["dtype"] == "torch.float32"
    assert lora_sync["lora_B_max"] > 0.5 and lora_sync["merged_moved"] > 0.01  # the merge changed every LoRA layer
    assert lora_sync["max_abs_diff"] <= 1e-6, lora_sync

    # The saved policy is an adapter: on the initial toy policy it gives the trained (gathered) weights exactly.
    model = full_dir / "model"
    assert PeftConfig.from_pretrained(model).peft_type == "LORA"
    assert PeftConfig.from_pretrained(model / "value_model").peft_type == "LORA"
    base = build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, seed=0)
    assert _state_hash(base) == r0["initial_policy_hash"]
    assert _state_hash(PeftModel.from_pretrained(base, model)) == r0["policy_hash"]

    checkpoint = full_dir / "run" / "checkpoint-2"
    shards = sorted(p.name for p in (checkpoint / "fsdp2_states").iterdir())
    assert ".metadata" in shards and len([p for p in shards if p.endswith(".distcp")]) == 2, shards
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert (checkpoint / "value_model" / "adapter_model.safetensors").is_file()
    resumed = _launch_two(resumed_dir, "fsdp2", settings | {"resume_from_checkpoint": str(checkpoint)})
    for rank, full in enumerate((r0, r1)):
        assert resumed[rank]["global_step"] == 3
        assert resumed[rank]["seen"] == full["seen"][2:]
        assert resumed[rank]["policy_hash"] == full["policy_hash"]
        assert resumed[rank]["critic_hash"] == full["critic_hash"]


@pytest.mark.parametrize("launcher", ["ddp", "fsdp2"])
def test_push_to_hub_uploads_once(tmp_path, launcher):
    """Both ranks call push_to_hub(); the main process alone uploads the policy and the critic (a local Hub stand-in).
    Under FSDP2 the weights are gathered from the shards first (every rank takes part), and the full ones go up; it
    also pushes at every checkpoint (`hub_strategy="every_save"`, `save_steps=1`): the checkpoint's full weights, none
    of its training state (FSDP2's shards, the optimizer)."""
    from ...hub_standin import HubStandIn

    server = HubStandIn().start()
    try:
        hub_env = {"HF_ENDPOINT": server.endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf")}
        overrides = {"push_to_hub": True, "hub_model_id": "test-org/ddp-run", "hub_token": "hf_test"}
        if launcher == "fsdp2":
            overrides |= {"hub_strategy": "every_save", "save_strategy": "steps", "save_steps": 1}
        r0, r1 = _launch_two(tmp_path, launcher, overrides, extra_env=hub_env)
        if launcher == "fsdp2":
            assert r0["policy_params"]["local"] < r0["policy_params"]["total"]  # it was sharded
    finally:
        server.stop()
    assert (r0["pushed"], r1["pushed"]) == (True, False)
    assert set(server.repos) == {"test-org/ddp-run", "test-org/ddp-run-value"}
    commits = [p for m, p, _ in server.requests if m == "POST" and "/commit/" in p]
    # The worker's save_model() pushes too (transformers' Trainer does with push_to_hub=True), then push_to_hub():
    # 2 pushes × 2 repos, each made by the main process only (2 ranks would make 8); FSDP2: 2 more per checkpoint.
    checkpoints = r0["global_step"] if launcher == "fsdp2" else 0  # one per update (save_steps=1)
    assert len(commits) == 4 + 2 * checkpoints
    policy_files = server.files("test-org/ddp-run")
    assert not [name for name in policy_files if "fsdp2_states" in name or "optimizer" in name or "rng_state" in name]
    with open(tmp_path / "run" / "model.safetensors", "rb") as f:
        assert policy_files["model.safetensors"] == f.read()
    with open(tmp_path / "run" / "value_model" / "model.safetensors", "rb") as f:
        assert server.files("test-org/ddp-run-value")["model.safetensors"] == f.read()


def test_zero3_with_cpu_offload(tmp_path):
    """configs/accelerate/zero3_offload.yaml (parameters and optimizer states offloaded) with 2 CPU ranks."""
    pytest.importorskip("deepspeed")
    from transformers import AutoModelForCausalLM

    launch = ["accelerate.commands.accelerate_cli", "launch", "--config_file"]
    launch += [os.path.join(REPO, "configs/accelerate/zero3_offload.yaml"), "--num_processes", "2"]
    launch += ["--main_process_port", "0"]
    r0, r1 = _launch(tmp_path, launch, worker_args=[json.dumps({"ddp_backend": "gloo"})])
    assert r0["distributed_type"] == "DistributedType.DEEPSPEED" and r0["num_processes"] == 2
    assert r0["global_step"] == 3
    for counts in (r0["policy_params"], r0["critic_params"]):
        assert counts["local"] < counts["total"]
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    assert _state_hash(AutoModelForCausalLM.from_pretrained(tmp_path / "model")) == r0["policy_hash"]


@pytest.mark.parametrize(
    ("launcher", "loss_type", "budget"),
    [
        ("ddp", "token_mean", None),
        ("ddp", "seq_mean_token_mean", None),
        ("zero3", "token_mean", None),
        ("fsdp2", "token_mean", None),
        ("fsdp2", "token_mean", "64 packed"),
        ("ddp", "token_mean", 64),
        ("zero3", "token_mean", 64),
        ("ddp", "token_mean", "64 packed"),
        ("zero3", "token_mean", "64 packed"),
        ("ddp", "token_mean", "vapo"),
        ("ddp", "token_mean", "64 vapo"),
        ("zero3", "token_mean", "64 packed vapo"),
        ("ddp", "token_mean", "sp checkpointing"),
        ("ddp", "token_mean", "vapo sp"),
        ("zero3", "token_mean", "64 sp"),
        ("fsdp2", "token_mean", "64 sp"),
        ("fsdp2", "token_mean", "fsdp-ac"),
        ("fsdp2", "token_mean", "bf16"),
    ],
)
def test_gradient_of_two_ranks_equals_one_big_batch(tmp_path, launcher, loss_type, budget):
    """Unequal micro-batches and ranks (rank 0 short responses, rank 1 long): the step's gradient is the gradient of
    the whole batch's loss — advantages whitened over both ranks, losses normalised by both ranks' count. DDP and FSDP2
    (gathered from its shards): every gradient; ZeRO-3 (whose gradients are partitioned): the engine's gradient norm. With a token budget
    (`max_tokens_per_micro_batch=64`) rank 0 alone would need fewer micro-batches than rank 1: both run rank 1's
    count (under ZeRO-3 anything else hangs), which differs from DeepSpeed's gradient_accumulation_steps (4); "packed":
    with padding-free forwards too; "vapo": every VAPO/DAPO policy-loss term on; "sp": sequence parallelism over both
    processes (each runs both ranks' micro-batches, split along the sequence by Ulysses' attention), with gradient
    checkpointing (whose backward recomputes the split forwards); "fsdp-ac": the FSDP config's activation checkpointing
    (`--fsdp_activation_checkpointing true`, accelerate's wrapper on each decoder layer); "bf16": bf16 mixed precision
    (`--mixed_precision bf16`, as configs/accelerate/fsdp2.yaml): FSDP2 gathers its float32 shards as bf16 and
    reduce-scatters the gradients in bf16 (over gloo here). The shards stay float32 (the master weights), every linear
    layer computes in bf16, and each gradient is within 3e-2 of its largest element (about 8 bf16 roundings, 2^-8
    each; measured 9.5e-3) of the one-process step run on the float32 weights cast to bf16 (the float32 step is as far:
    1.2e-2, which is why the computing dtype is checked directly)."""
    flags = str(budget).split()
    launch_args = ["--fsdp_activation_checkpointing", "true"] if "fsdp-ac" in flags else []
    launch_args += ["--mixed_precision", "bf16"] if "bf16" in flags else []
    _run_worker(GRAD_WORKER, launcher, [str(tmp_path), loss_type, *str(budget or "").split()], launch_args=launch_args)
    result = json.load(open(tmp_path / "grad_check.json"))
    assert result["num_processes"] == 2
    assert result["deepspeed"] == (launcher == "zero3") and result["fsdp2"] == (launcher == "fsdp2")
    assert result["chunked_logprobs"]
    assert result["on_policy_shortcut"]  # so this also checks the shortcut's gradient under DDP and ZeRO-3
    assert result["finite_losses"] and result["parameter_dtypes"] == ["torch.float32"]
    assert result["computed_in"] == ["torch.bfloat16" if "bf16" in flags else "torch.float32"]
    tolerance = 3e-2 if "bf16" in flags else 1e-4
    assert result["grad_norm_relative_difference"] < tolerance
    if "bf16" in flags:  # against the one-process step computed in bf16 on float32 weights
        assert result["max_relative_difference_bf16"] < tolerance
    elif launcher in ("ddp", "fsdp2"):  # FSDP2: every gradient, gathered from its shards
        assert result["max_relative_difference"] < tolerance
    value_loss = result["value_loss"]  # logged: its mean over the processes is the global loss
    assert sum(value_loss) / 2 == pytest.approx(result["expected_value_loss"], rel=tolerance)
    counts = result["micro_batches"]
    assert counts[0] == counts[1]
    assert result["checkpoint_wrapped"] == (2 if "fsdp-ac" in flags else 0)  # the policy's and the critic's layer
    if "fsdp-ac" in flags:  # saved under the layers' own names
        assert result["saved_names_match"]
    if "vapo" in str(budget):  # the LM loss ran, over the correct responses of both ranks
        assert result["positive_tokens"] > 0 and result["positive_example_lm"] > 0
    if "sp" in flags:  # both ranks' rows on each, the same plan on both
        assert counts == ([2, 2] if "64" in flags else [8, 8])
        assert result["computed_tokens"][0] == result["computed_tokens"][1]
    elif budget in (None, "vapo", "fsdp-ac", "bf16"):
        assert counts == [4, 4]
    else:  # grouped by length: fewer than the 4 single-sequence micro-batches, and fewer tokens on the short rank
        assert counts[0] < 4 and result["computed_tokens"][0] < result["computed_tokens"][1]


def test_sequence_parallel_training_on_two_ranks_under_zero3(tmp_path):
    """`sequence_parallel_size=2` under ZeRO-3 through the whole run (value pretraining, then VC-PPO updates, sharded
    generation with the original attention, saving): both ranks end with the same weights, every logged loss is
    finite, and the saved policy loads."""
    from transformers import AutoModelForCausalLM

    r0, r1 = _launch_two(tmp_path, "zero3", {"sequence_parallel_size": 2})
    assert r0["global_step"] == r1["global_step"] > 1
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    names = ("value_pretrain/loss_avg", "loss/value_avg", "loss/policy_avg")
    losses = [m[name] for m in r0["metrics"] for name in names if name in m]
    assert len(losses) > 2 and all(math.isfinite(x) for x in losses)
    # One group of both processes: nothing to wait for across groups
    assert [m["perf/rank_token_imbalance"] for m in r0["metrics"] if "loss/policy_avg" in m] == [1.0, 1.0]
    assert _state_hash(AutoModelForCausalLM.from_pretrained(tmp_path / "model")) == r0["policy_hash"]


@pytest.mark.parametrize("launcher", ["ddp", "zero3"])
def test_sequence_parallel_rollout_forwards_equal_the_whole_ones(tmp_path, launcher):
    """`sequence_parallel_size=2`: the rollout's no-grad forwards, each micro-batch split across both processes over
    their shared rows, give every process the old log-probs, values and reference log-probs (a reference model of its
    own: a ZeRO-3 engine under ZeRO-3) that the same forwards whole on each process give, with a token budget, on a
    rollout the trainer made and on rows of uneven lengths and counts, and a generation window's bootstrap values;
    generation ran with the switch off. Without the sum over the group they would not agree."""
    _run_worker(SP_ROLLOUT_WORKER, launcher, [str(tmp_path)])
    result = json.load(open(tmp_path / "sp_rollout.json"))
    assert result["num_processes"] == 2 and result["deepspeed"] == (launcher == "zero3")
    assert result["reference_is_engine"] == (launcher == "zero3")
    r0, r1 = result["ranks"]
    for r in (r0, r1):
        for case in ("made", "uneven", "window"):
            for name, difference in r[case].items():
                assert difference < 1e-5, (case, name, difference)
        assert all(difference > 0.1 for difference in r["unsummed"].values()), r["unsummed"]
        assert r["switch_in_generation"] == [0] and r["switch_after"] == 0
        assert r["split_micro_batches"] > 1  # the budget cut the group's rows
    # Both processes ran the same split micro-batches, each its share of the tokens.
    assert r0["split_micro_batches"] == r1["split_micro_batches"]
    assert r0["computed_tokens"] == r1["computed_tokens"]


@pytest.mark.parametrize(("launcher", "forwards"), [("ddp", "budget"), ("ddp", "packed"), ("zero3", "budget")])
def test_balanced_ranks_give_the_unbalanced_gradient(tmp_path, launcher, forwards):
    """`balance_ranks` with rank 0 holding short responses and rank 1 long ones: every optimizer step's gradient equals
    the unbalanced step's within 1e-5 of the largest entry (float32; the same sequences per global mini-batch, only
    the sums' order changes) — over 2 epochs × 2 mini-batches with the sampler-mismatch correction, under the on-policy
    shortcut and with a generation window's fields; what the balanced forwards computed per row (old log-probs,
    sampler weights) comes back to the row's owner; each row's fields and tokens travel together. ZeRO-3: the
    gradient norms (its gradients are partitioned)."""
    _run_worker(BALANCE_WORKER, launcher, [str(tmp_path), forwards], timeout=300)
    result = json.load(open(tmp_path / "balance_check.json"))
    assert result["num_processes"] == 2 and result["deepspeed"] == (launcher == "zero3")
    for name, steps in (("epochs", 4), ("shortcut", 1), ("windows", 4)):
        case = result[name]
        off, on = case["balance_off"], case["balance_on"]
        assert set(off) == {"perf/rank_token_imbalance"}  # measured with balancing off too
        assert on["perf/rank_token_imbalance_before"] == pytest.approx(off["perf/rank_token_imbalance"])
        assert on["perf/rank_token_imbalance"] < off["perf/rank_token_imbalance"]
        assert case["grad_norm"][1] == pytest.approx(case["grad_norm"][0], rel=1e-5)
        if launcher == "ddp":
            assert case["optimizer_steps"] == steps
            assert case["max_relative_difference"] < 1e-5, name
    assert max(result["epochs"]["importance_weights"]) < 1e-5  # the sampler weights came back to their rows
    assert max(result["shortcut"]["old_logprobs"]) < 1e-5  # the on-policy shortcut's log-probs too
    exchange = result["exchange"]
    assert exchange["fields_together"] == [True, True] and exchange["lengths_follow"] == [True, True]
    assert exchange["rows"] == [8, 8]  # as many rows per process as before
    for m in range(2):  # each global mini-batch holds the rows it held without balancing
        after = sorted(exchange["mini_batches"][0][m] + exchange["mini_batches"][1][m])
        assert after == sorted(exchange["own_mini_batches"][0][m] + exchange["own_mini_batches"][1][m])
    assert sum(exchange["tokens"]) == sum(exchange["own_tokens"])
    assert max(exchange["tokens"]) < max(exchange["own_tokens"])


@pytest.mark.parametrize(
    "overrides",
    [
        {"generation_window": 4, "total_episodes": 64, "max_tokens_per_micro_batch": 64},
        {"num_generations": 4, "dynamic_sampling": True, "dynamic_sampling_max_rounds": 4, "padding_free": True},
    ],
    ids=["windows", "dynamic-sampling"],
)
def test_balanced_ranks_train_with_windows_and_dynamic_sampling(tmp_path, overrides):
    """Generation windows and dynamic sampling hand the learner a rollout like any other: with `balance_ranks` the
    ranks train to the same weights and log how even their tokens were."""
    r0, r1 = _launch_two(tmp_path, "ddp", overrides | {"balance_ranks": True})
    assert r0["global_step"] == r1["global_step"] > 1
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    updates = [m for m in r0["metrics"] if "perf/rank_token_imbalance" in m]
    assert len(updates) == r0["global_step"]
    for m in updates:
        assert 1.0 <= m["perf/rank_token_imbalance"] <= m["perf/rank_token_imbalance_before"]


@pytest.mark.parametrize("launcher", ["ddp", "zero3-sharded-generation"])
def test_dynamic_sampling_runs_the_same_rounds_on_every_rank(tmp_path, launcher):
    """Each rank keeps its own informative groups, but every rank generates in every round (under ZeRO-3 sharded
    generation a rank that stopped would hang the other): the same rounds, the same batch shape, the same weights."""
    overrides = {"num_generations": 4, "dynamic_sampling": True, "dynamic_sampling_max_rounds": 4}
    ranks = _launch_two(tmp_path, launcher, overrides)
    r0, r1 = ranks
    assert r0["global_step"] == r1["global_step"] == 3
    assert r0["batches_consumed"] == r1["batches_consumed"] == len(r0["seen"]) == len(r1["seen"])
    ppo = [m for m in r0["metrics"] if "sampling/dynamic_rounds" in m]
    assert len(ppo) == 2 and r0["batches_consumed"] == 1 + sum(m["sampling/dynamic_rounds"] for m in ppo)
    assert r0["last_rollout_rows"] == r1["last_rollout_rows"] == 8
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])


def test_ddp_refuses_explicit_no_unused_parameters_with_value_pretraining(tmp_path):
    """Value-only updates leave the policy out of the graph: DDP must look for unused parameters, and an explicit
    `ddp_find_unused_parameters=False` stops at construction with the fix instead of hanging in the first update."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=os.path.join(REPO, "src"), **CPU)
    overrides = json.dumps({"ddp_find_unused_parameters": False})
    cmd = [sys.executable, "-m", *TORCHRUN, WORKER, str(tmp_path), overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode != 0
    assert "ddp_find_unused_parameters=False cannot run value pretraining under DDP" in proc.stdout + proc.stderr


@pytest.mark.parametrize("pool", [None, 16])
@pytest.mark.parametrize("launcher", ["ddp", "zero3"])
def test_generation_windows_on_two_ranks(tmp_path, launcher, pool):
    """Each rank keeps its own pool; every rank generates in every update with one budget (ZeRO-3's sharded generation
    is collective), the ranks end with the same weights, and the counts are over both pools. With `rollout_pool_size`
    16 (twice the rank's rollout batch of 8) each rank trains its 16 in-flight rows in the same optimizer steps."""
    overrides = {"generation_window": 4, "total_episodes": 64, "rollout_pool_size": pool}
    ranks = _launch_two(tmp_path, launcher, overrides)
    r0, r1 = ranks
    assert r0["global_step"] == r1["global_step"] > 1
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    updates = [m for m in r0["metrics"] if "rollout/window_tokens" in m]
    assert len(updates) == r0["global_step"] and any(m["rollout/in_flight"] > 0 for m in updates)
    assert [m["rollout/finished_responses"] for m in updates] == [
        m["rollout/finished_responses"] for m in r1["metrics"] if "rollout/window_tokens" in m
    ]
    if pool is not None:  # both pools of 16: what finished and what is in flight add up to 2 x 16 every update
        assert all(m["rollout/finished_responses"] + m["rollout/in_flight"] == 2 * pool for m in updates)


def test_generation_windows_resume_on_two_ranks_equals_the_uninterrupted_run(tmp_path):
    """A 2-rank windowed run resumed from its checkpoint continues each rank's in-flight responses and each rank's own
    prompt-stream position (the pools refill at different paces), and ends where the uninterrupted run ends, bit for
    bit."""
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full_dir.mkdir()
    resumed_dir.mkdir()
    windows = {"generation_window": 4, "total_episodes": 48}
    saves = windows | {"save_strategy": "steps", "save_steps": 1}
    full = _launch(full_dir, TORCHRUN, CPU, worker_args=[json.dumps(saves)])
    checkpoint = full_dir / "run" / "checkpoint-2"
    assert (checkpoint / "rollout_pool_0.pt").is_file() and (checkpoint / "rollout_pool_1.pt").is_file()
    resumed = _launch(
        resumed_dir, TORCHRUN, CPU, worker_args=[json.dumps(windows | {"resume_from_checkpoint": str(checkpoint)})]
    )

    def trained(rank):
        return [
            {k: v for k, v in m.items() if not k.startswith("time/") and k != "perf/rollout_wait_s"}
            for m in rank["metrics"]
        ]

    for rank in (0, 1):
        assert resumed[rank]["global_step"] == full[rank]["global_step"] == 4
        assert resumed[rank]["seen"] == full[rank]["seen"][-len(resumed[rank]["seen"]) :]
        assert resumed[rank]["completions"] == full[rank]["completions"][-len(resumed[rank]["completions"]) :]
        assert json.dumps(trained(resumed[rank])) == json.dumps(trained(full[rank])[2:])  # NaN-safe equality
        assert resumed[rank]["policy_hash"] == full[rank]["policy_hash"]
        assert resumed[rank]["critic_hash"] == full[rank]["critic_hash"]


def test_overlap_on_two_ranks_equals_its_resumed_run(tmp_path):
    """`max_staleness=1` under DDP: each rank has its own rollout worker and samples its own prompts; the ranks end with
    the same weights; each batch after the first PPO update is one update stale; a run resumed from a checkpoint (with
    each rank's queued batch) ends where the uninterrupted run ends, bit for bit."""
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full_dir.mkdir()
    resumed_dir.mkdir()
    overlap = {"max_staleness": 1, "total_episodes": 48}
    full = _launch(
        full_dir, TORCHRUN, CPU, worker_args=[json.dumps(overlap | {"save_strategy": "steps", "save_steps": 1})]
    )
    r0, r1 = full
    assert r0["global_step"] == r1["global_step"] == 4
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    assert [m["sampling/staleness_max"] for m in r0["metrics"]] == [0.0, 0.0, 1.0, 1.0]
    assert r0["seen"] != r1["seen"]  # each rank its own prompts
    checkpoint = full_dir / "run" / "checkpoint-2"
    resumed = _launch(
        resumed_dir, TORCHRUN, CPU, worker_args=[json.dumps(overlap | {"resume_from_checkpoint": str(checkpoint)})]
    )

    def trained(rank):
        return [
            {k: v for k, v in m.items() if not k.startswith("time/") and k != "perf/rollout_wait_s"}
            for m in rank["metrics"]
        ]

    for rank in (0, 1):
        assert resumed[rank]["global_step"] == 4
        assert json.dumps(trained(resumed[rank])) == json.dumps(trained(full[rank])[2:])
        assert resumed[rank]["policy_hash"] == full[rank]["policy_hash"]
        assert resumed[rank]["critic_hash"] == full[rank]["critic_hash"]


def test_overlap_under_zero3_gathers_the_policy_for_its_workers(tmp_path):
    """`max_staleness=1` under ZeRO-3: each rank's worker starts from, and is pushed, the gathered policy (a collective
    on every rank); the ranks end with the same weights and the batches are one update stale after the first."""
    pytest.importorskip("deepspeed")
    config = os.path.join(REPO, "configs/accelerate/zero3_cpu.yaml")
    launch = ["accelerate.commands.accelerate_cli", "launch", "--config_file", config, "--main_process_port", "0"]
    overrides = {"max_staleness": 1, "total_episodes": 48, "ddp_backend": "gloo"}
    r0, r1 = _launch(tmp_path, launch, worker_args=[json.dumps(overrides)])
    assert r0["global_step"] == r1["global_step"] == 4
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    assert [m["sampling/staleness_max"] for m in r0["metrics"]] == [0.0, 0.0, 1.0, 1.0]
    # The worker sampled from the weights the trainer had: at staleness 0 its log-probs match the training forward's.
    assert r0["metrics"][1]["sampling/sampling_logp_difference/max"] < 1e-4


def test_overlap_under_fsdp2_gathers_the_policy_for_its_workers(tmp_path):
    """`max_staleness=1` under FSDP2: each rank's worker starts from, and is pushed, the policy gathered from its
    shards on every rank (one tensor at a time, a collective), in a model of the class before sharding; the ranks end
    with the same weights, the batches are one update stale after the first, and at staleness 0 the worker sampled
    from the trainer's weights."""
    r0, r1 = _launch_two(tmp_path, "fsdp2", {"max_staleness": 1, "total_episodes": 48})
    assert r0["global_step"] == r1["global_step"] == 4
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    assert [m["sampling/staleness_max"] for m in r0["metrics"]] == [0.0, 0.0, 1.0, 1.0]
    assert r0["metrics"][1]["sampling/sampling_logp_difference/max"] < 1e-4


def test_fsdp2_bf16_with_the_lm_head_in_float32_trains_on_two_ranks(tmp_path):
    """`cast_lm_head_to_fp32` under FSDP2 with bf16 (the head's unit gathered in float32, the rest in bf16; exactness
    in tests/unit/test_fp32_head.py) through the whole run: value pretraining, PPO updates with the KL penalty on (the
    reference's head cast too), generation and saving; both ranks end with the same weights and finite losses."""
    overrides = {"bf16": True, "cast_lm_head_to_fp32": True, "kl_coef": 0.05}
    r0, r1 = _launch_two(tmp_path, "fsdp2", overrides)
    assert r0["fsdp2"] and r0["global_step"] == r1["global_step"] == 3
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    names = ("value_pretrain/loss_avg", "loss/value_avg", "loss/policy_avg")
    losses = [m[name] for m in r0["metrics"] for name in names if name in m]
    assert len(losses) > 2 and all(math.isfinite(x) for x in losses)


def test_windows_with_overlap_on_two_ranks(tmp_path):
    """`generation_window` with `max_staleness=1` under DDP: each rank's worker samples its pool's next window while
    the update trains; the ranks end with the same weights."""
    overrides = {"generation_window": 4, "max_staleness": 1, "total_episodes": 48}
    r0, r1 = _launch(tmp_path, TORCHRUN, extra_env=CPU, worker_args=[json.dumps(overrides)])
    assert r0["global_step"] == r1["global_step"] == 4
    assert (r0["policy_hash"], r0["critic_hash"]) == (r1["policy_hash"], r1["critic_hash"])
    assert [m["sampling/staleness_max"] for m in r0["metrics"]] == [0.0, 0.0, 1.0, 1.0]
    assert all(m["rollout/window_tokens"] > 0 for m in r0["metrics"])


@pytest.mark.parametrize("launcher", ["ddp", "zero3"])
def test_two_ranks_store_their_shares_of_each_batch(tmp_path, launcher):
    """The store-rollouts job on two processes: each writes its own shard of every batch, holding the prompts its
    online value-pretraining phase would draw; process 0 writes the info, whose weights hash (ZeRO-3: gathered) is the
    initial policy's on both layouts."""
    from vcppo_trl.rollout import load_stored_rollouts

    overrides = {"store_rollouts": 2}
    ranks = _launch_two(tmp_path, launcher, overrides)
    info, rows = load_stored_rollouts(str(tmp_path / "rollouts"))
    assert sorted(os.listdir(tmp_path / "rollouts" / "data")) == [
        f"batch-{b:06d}-process-{p:05d}-of-00002.parquet" for b in range(2) for p in range(2)
    ]
    assert info.layout == {"num_processes": 2, "prompts_per_process": 8}
    for rank, report in enumerate(ranks):
        assert report["store"]["batches_written"] == 2 and report["store"]["complete_batches"] == 2
        for batch in range(2):
            mine = [r for r in rows if r["batch"] == batch and r["process"] == rank]
            assert [r["idx"] for r in mine] == report["seen"][batch]  # the prompts its reward function saw
            assert [r["rewards"][0] for r in mine] == report["rewards"][batch]
    # The toy policy is built with seed 0 on every rank and layout: one hash for all (ZeRO-3 gathers it first).
    from vcppo_trl.rollout import weights_sha256
    from vcppo_trl.toy.model import build_tiny_model
    from vcppo_trl.toy.tokenizer import build_tokenizer

    policy = build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, seed=0)
    assert info.policy["weights_sha256"] == weights_sha256(policy)


def test_logged_completions_hold_both_ranks_rows(tmp_path):
    """`log_completions` on two processes: each step's parquet file, written once, holds every rank's completions of
    the update, rank 0's first."""
    import pandas as pd

    ranks = _launch(tmp_path, TORCHRUN, extra_env=CPU, worker_args=[json.dumps({"log_completions": True})])
    folder = tmp_path / "run" / "completions"
    assert sorted(os.listdir(folder)) == [f"completions_{step:05d}.parquet" for step in (1, 2, 3)]
    for step in (1, 2, 3):
        frame = pd.read_parquet(folder / f"completions_{step:05d}.parquet")
        assert len(frame) == 16 and set(frame["step"]) == {step}
        expected = ranks[0]["completions"][step - 1] + ranks[1]["completions"][step - 1]
        assert frame["completion"].tolist() == expected
        assert frame["length_reward"].tolist() == ranks[0]["rewards"][step - 1] + ranks[1]["rewards"][step - 1]


def test_two_ranks_pretrain_a_critic_from_stored_rollouts(tmp_path):
    """A critic job (`value_pretrain_only`) from rollouts two DDP processes stored, on two processes under DDP and
    under ZeRO-3: each process reads its own shards (two epochs over two batches), the ranks end at one critic, and
    no policy is kept (its hash, taken at build time, matched the stored one)."""
    stored = tmp_path / "store"
    stored.mkdir()
    _launch(stored, TORCHRUN, extra_env=CPU, worker_args=[json.dumps({"store_rollouts": 2})])
    job = {
        "value_pretrain_dataset": str(stored / "rollouts"),
        "value_pretrain_only": True,
        "value_pretrain_steps": 4,
        "value_pretrain_min_steps": 4,
    }
    ddp, zero3 = tmp_path / "ddp", tmp_path / "zero3"
    ddp.mkdir()
    zero3.mkdir()
    r0, r1 = _launch_two(ddp, "ddp", job)
    z0, z1 = _launch_two(zero3, "zero3", job)
    for a, b in ((r0, r1), (z0, z1)):
        assert a["global_step"] == b["global_step"] == 4
        assert a["critic_hash"] == b["critic_hash"]
        assert a["policy_hash"] is None and a["policy_params"] is None  # the critic job keeps no policy
        assert a["seen"] == []  # no reward function ran: nothing was sampled
    assert os.path.isfile(ddp / "run" / "value_pretrained" / "model.safetensors")
    assert os.path.isfile(zero3 / "run" / "value_pretrained" / "model.safetensors")


def test_fsdp2_shards_the_models_and_trains_as_ddp_does(tmp_path):
    """FSDP2 on two CPU processes (configs/accelerate/fsdp2_cpu.yaml, accelerate's FSDP2 code called by the trainer,
    since accelerate makes no FSDP plugin on a CPU): policy, critic and reference are sharded, every rank samples the
    completions the DDP run samples (the same weights, gathered for every forward), and the saved models equal the DDP
    run's up to summation order (reduce-scatter against all-reduce). A value-pretraining update, then two PPO updates
    with the KL penalty on."""
    import safetensors.torch
    import torch

    overrides = {"kl_coef": 0.1}
    ddp, fsdp2 = tmp_path / "ddp", tmp_path / "fsdp2"
    ddp.mkdir()
    fsdp2.mkdir()
    d0, d1 = _launch_two(ddp, "ddp", overrides)
    f0, f1 = _launch_two(fsdp2, "fsdp2", overrides)
    for f, d in ((f0, d0), (f1, d1)):
        assert f["distributed_type"] == "DistributedType.MULTI_CPU" and f["num_processes"] == 2
        assert f["global_step"] == d["global_step"] == 3
        assert f["completions"] == d["completions"] and f["rewards"] == d["rewards"]
        for counts in (f["policy_params"], f["critic_params"]):
            assert 0 < counts["local"] < counts["total"]  # this rank holds its shard only
    assert f0["policy_params"]["local"] + f1["policy_params"]["local"] == f0["policy_params"]["total"]
    assert f0["vllm_weights_match"]  # a vLLM sync's weights, gathered per tensor from both shards, are the full ones
    for folder in ("model", "model/value_model"):
        got = safetensors.torch.load_file(fsdp2 / folder / "model.safetensors")
        expected = safetensors.torch.load_file(ddp / folder / "model.safetensors")
        assert got.keys() == expected.keys()  # tied weights written once, as an unsharded model writes them
        for name, tensor in expected.items():
            torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-5)
    assert f0["policy_hash"] != f0["initial_policy_hash"]  # it trained (the hash of rank 0's gathered weights)


def test_fsdp2_resume_from_its_sharded_checkpoint_equals_the_uninterrupted_run(tmp_path):
    """Two FSDP2 ranks save torch distributed checkpoints of their shards (model and optimizer, `.distcp` files) with
    full safetensors beside them; resumed from update 2 they end with the uninterrupted run's weights, bit for bit."""
    full_dir, resumed_dir = tmp_path / "full", tmp_path / "resumed"
    full_dir.mkdir()
    resumed_dir.mkdir()
    settings = {"weight_decay": 0.1, "kl_coef": 0.1}
    full = _launch_two(full_dir, "fsdp2", settings | {"save_strategy": "steps", "save_steps": 1})
    checkpoint = full_dir / "run" / "checkpoint-2"
    shards = sorted(p.name for p in (checkpoint / "fsdp2_states").iterdir())
    assert ".metadata" in shards and len([p for p in shards if p.endswith(".distcp")]) == 2, shards
    assert (checkpoint / "model.safetensors").is_file() and not (checkpoint / "optimizer.pt").exists()
    resumed = _launch_two(resumed_dir, "fsdp2", settings | {"resume_from_checkpoint": str(checkpoint)})
    for rank in (0, 1):
        assert resumed[rank]["global_step"] == 3
        assert resumed[rank]["seen"] == full[rank]["seen"][2:]
        assert resumed[rank]["policy_hash"] == full[rank]["policy_hash"]
        assert resumed[rank]["critic_hash"] == full[rank]["critic_hash"]
    assert full[0]["policy_hash"] != full[0]["initial_policy_hash"]


def test_fsdp2_low_memory_loading_shards_rank_0s_weights(tmp_path):
    """`fsdp_cpu_ram_efficient_loading: true` with the models loaded from a directory: the policy (from the
    checkpoint), the critic built from it (a new value head) and the reference (a copy), each sharded with accelerate's
    broadcast of rank 0's weights. Rank 1 spoils its own copies before sharding (transformers 5 reads the checkpoint on
    every rank, on CPU, not on `meta`), so only the broadcast can give the checkpoint's weights; without low-memory
    loading the same run shards rank 1's copies and fails here. Then one update trains with finite losses."""
    from vcppo_trl.toy.model import build_tiny_model
    from vcppo_trl.toy.tokenizer import build_tokenizer

    build_tiny_model(build_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(
        tmp_path / "model"
    )
    launch_args = ["--fsdp_cpu_ram_efficient_loading", "true"]
    _run_worker(LOADING_WORKER, "fsdp2", [str(tmp_path / "out"), str(tmp_path / "model")], launch_args=launch_args)
    result = json.load(open(tmp_path / "out" / "loading.json"))
    assert result["sharded_on"] == [["cpu"], ["cpu"]]  # nothing left on `meta`
    assert result["policy_equals_checkpoint"] and result["reference_equals_checkpoint"]
    assert result["critic_backbone_equals_checkpoint"]
    assert result["critic_head_is_rank_0s"] and result["critic_head_sum"] > 0
    assert all(result["ranks_agree"].values())
    assert result["finite_losses"] and len(result["losses"]) >= 2


@pytest.mark.parametrize("launcher", ["ddp", "zero3", "fsdp2"])
def test_tool_episodes_keep_the_ranks_in_step(tmp_path, launcher):
    """`tools=` on two processes: rank 0's episodes call a tool twice (scripted turns), rank 1's none; rank 1 joins
    rank 0's extra generation rounds (under ZeRO-3 and FSDP2 generation is collective: a missed call would hang), and
    the ranks end with the same weights. TRL's tools/call_frequency is over both ranks' episodes."""
    _run_worker(TOOLS_WORKER, launcher, [str(tmp_path)])
    r0, r1 = (json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1))
    for r in (r0, r1):
        assert r["deepspeed"] == (launcher == "zero3") and r["fsdp2"] == (launcher == "fsdp2")
    assert r0["global_step"] == r1["global_step"] == 2
    assert r0["generation_calls"] == r1["generation_calls"] == 2 * 3  # 3 rounds per update, on both ranks
    assert r0["policy_hash"] == r1["policy_hash"]
    assert [m["tools/call_frequency"] for m in r0["tools"]] == [1.0, 1.0]  # 2 calls on half the episodes


def test_tool_episodes_under_windows_keep_the_ranks_in_step(tmp_path):
    """`tools=` with `generation_window=48` on two ZeRO-3 processes (generation sharded, so collective): rank 0's
    episodes call a tool twice in turns that span windows, rank 1's model writes its own turns; in every window both
    ranks take the same generation calls, the tool metrics are logged (over both ranks' finished episodes) once
    episodes finish, and the ranks end with the same weights."""
    _run_worker(TOOLS_WORKER, "zero3", [str(tmp_path), "48"])
    r0, r1 = (json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1))
    assert r0["deepspeed"] and r1["deepspeed"]
    assert r0["global_step"] == r1["global_step"] == 4
    # Rank 0's windows: 48 of the first call's 72 tokens; its last 24, the call, 24 of the second; its last 48, the
    # call (the budget ends with the turn: the result is appended in the same window); the answer. Rank 1 joins each.
    assert r0["generation_calls"] == r1["generation_calls"] == 1 + 2 + 1 + 1
    assert r0["policy_hash"] == r1["policy_hash"]
    assert r0["finished"] == r1["finished"] and sum(r0["finished"]) >= 4  # rank 0's 4 episodes at least
    assert r0["tools"] == r1["tools"] and r0["tools"]
    # Over the finished episodes: rank 1's (no call) from the first update, rank 0's (2 calls each) in the last.
    *earlier, last = [m["tools/call_frequency"] for m in r0["tools"]]
    assert last > 0 and not any(earlier)


@pytest.mark.parametrize("window", [None, 24])
def test_tool_episodes_in_each_ranks_rollout_worker(tmp_path, window):
    """`tools=` with `max_staleness=1` on two DDP processes: each rank's rollout worker runs that rank's episodes (whole,
    or a window ahead), the `add` calls happen in the workers, each rank scores its own prompts, the logged staleness
    and tool metrics are the same on both ranks (over both ranks' episodes), and the ranks end with the same weights."""
    _run_worker(TOOL_OVERLAP_WORKER, "ddp", [str(tmp_path)] + ([] if window is None else [str(window)]))
    r0, r1 = (json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1))
    assert r0["global_step"] == r1["global_step"] == 4
    assert r0["policy_hash"] == r1["policy_hash"]
    assert r0["staleness"] == r1["staleness"] == [0.0, 1.0, 1.0, 1.0]
    assert r0["tools"] == r1["tools"]
    assert any(m.get("tools/call_frequency", 0) > 0 for m in r0["tools"])  # calls made in the workers
    assert r0["seen"] and r1["seen"] and not set(r0["seen"]) & set(r1["seen"])  # each rank its own prompts


@pytest.mark.parametrize("launcher", ["ddp", "zero3", "fsdp2"])
def test_rollout_func_on_two_ranks(tmp_path, launcher):
    """TRL's `rollout_func` on two processes (rollout_func_worker.py: a seeded sampler of its own, a 5-token tool block
    in every completion with `env_mask` 0, an extra `tag` key, the KL penalty on; rank 1's completions 4 policy tokens
    longer than rank 0's): each rank's function gets its own 4 prompts per update, once each; the tags reach the reward
    function with the right per-sample values; the tool tokens get no KL, reward, advantage or return; the logged
    length and score metrics are those of both ranks' completions together; the ranks end with the same weights."""
    _run_worker(ROLLOUT_FUNC_WORKER, launcher, [str(tmp_path)])
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    for r in ranks:
        assert r["num_processes"] == 2 and r["global_step"] == 2
        assert r["deepspeed"] == (launcher == "zero3") and r["fsdp2"] == (launcher == "fsdp2")
        assert [len(call["numbers"]) for call in r["calls"]] == [4, 4]  # 4 prompts a call, each twice; 2 updates
        assert r["reward_rows"] == 16 and not r["mismatches"]  # every tag matched its row's idx and completion
        expected_tags = [[f"{n}:{j}" for n in call["numbers"] for j in (0, 1)] for call in r["calls"]]
        assert r["reward_tags"] == expected_tags
        assert r["tool_tokens_per_row"] == [5] * 8
        assert r["on_tool_max_abs"] == {"kl": 0.0, "rewards": 0.0, "advantages": 0.0, "returns": 0.0}
        assert r["kl_on_policy_tokens_max_abs"] > 0  # the second update's policy moved from the reference
    numbers = [n for r in ranks for call in r["calls"] for n in call["numbers"]]
    assert len(set(numbers)) == len(numbers) == 16  # the ranks' prompts do not overlap
    for update in range(2):
        lengths = [x for r in ranks for x in r["calls"][update]["policy_lengths"]]
        rewards = [x for r in ranks for x in r["rewards"][update]]
        assert max(ranks[0]["calls"][update]["policy_lengths"]) < min(ranks[1]["calls"][update]["policy_lengths"])
        for r in ranks:  # every rank logs the metrics of both ranks' completions
            logged = r["metrics"][update]
            assert logged["diagnostics/response_length_mean"] == pytest.approx(sum(lengths) / 16)
            assert logged["diagnostics/response_length_min"] == min(lengths)
            assert logged["diagnostics/response_length_max"] == max(lengths)
            assert logged["rewards/tagged_reward/mean"] == pytest.approx(sum(rewards) / 16)
            assert "sampling/importance_sampling_ratio/mean" in logged  # the function's logprobs were used
    assert ranks[0]["policy_hash"] == ranks[1]["policy_hash"] != ranks[0]["initial_policy_hash"]
    assert ranks[0]["critic_hash"] == ranks[1]["critic_hash"]


@pytest.mark.parametrize("launcher, estimator", [("ddp", "grpo"), ("zero3", "rloo")])
def test_group_advantages_use_both_ranks_scores(tmp_path, launcher, estimator):
    """A group advantage estimator on two processes (advantage_worker.py): GRPO with `scale_rewards="batch"` and RLOO
    with `normalize_advantages` and the KL in its reward take their batch statistics over both ranks' responses, as
    TRL's do: the advantages each rank trained on equal `group_advantages` of both ranks' scores together (and not
    of its own alone), one per response on its policy tokens; no critic exists on either rank; the ranks end with the
    same policy."""
    _run_worker(ADVANTAGE_WORKER, launcher, [str(tmp_path), estimator])
    result = json.load(open(tmp_path / "advantages.json"))
    assert result["updates"] == 2
    assert result["max_abs_diff"] < 1e-5
    assert all(result["checks"]), result["checks"]
    assert not result["critic_anywhere"]
    assert result["policy_hashes"][0] == result["policy_hashes"][1]
