"""Benchmark: FSDP2 against DeepSpeed ZeRO-3 (and DDP, unsharded) on 2 CPU processes at the same work — the PPO
update's time and each process's memory. A CPU figure: it says little about GPUs (no NCCL, no overlap of
communication with compute, host memory rather than device memory).

    python benchmarks/backends.py            # 3 repeats per backend, a few minutes on 2 cores (needs a quiet machine)
    python benchmarks/backends.py --smoke    # tiny sizes, 1 repeat (checks that it runs)

Each launch starts 2 processes over gloo — `torch.distributed.run` with `ACCELERATE_USE_CPU=1` (DDP), `accelerate
launch` with configs/accelerate/zero3_cpu.yaml (ZeRO-3) or fsdp2_cpu.yaml (FSDP2), as tests/integration/distributed
does — builds a Qwen2 policy and its critic (benchmarks/token_budget.py's pair: hidden 512, 4 layers, float32), a
`PPOTrainer` prepared by the backend (its own sharding, optimizer and engine), and a rollout of 8 sequences per process
built directly (prompts 24–64 tokens, responses of 256), then times `PPOLearner.update` (one epoch, one mini-batch of
4 micro-batches of 2 sequences: forward, backward, the backend's gradient reduction and the AdamW step) from a barrier
to the slower process's end, after one warm-up update. Memory per process, from /proc/self/status: the resident set
after setup (models prepared, before the first update) and its peak during the updates (VmHWM, reset after setup), and
the parameter elements the process holds (its shards under ZeRO-3 and FSDP2). Backends run in rotating order.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import token_budget  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("ddp", "zero3", "fsdp2")
PER_RANK = 8
ROWS_PER_MICRO_BATCH = 2


def memory_kib(field: str) -> int:
    """A field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    """Set VmHWM back to the current resident set (Linux: 5 > /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def local_elements(model: torch.nn.Module) -> int:
    """Parameter elements this process holds: ZeRO-3's partitions, FSDP2's local shards, or the whole model."""
    total = 0
    for p in model.parameters():
        if hasattr(p, "ds_tensor"):
            total += p.ds_tensor.numel()
        elif hasattr(p, "to_local"):
            total += p.to_local().numel()
        else:
            total += p.numel()
    return total


def run_worker(args: argparse.Namespace) -> None:
    """One process: the pair (built before the config: under ZeRO-3 a model built after it is created partitioned),
    the trainer, a warm-up and `args.updates` timed updates; writes its own JSON."""
    from vcppo_trl import PPOConfig, PPOTrainer
    from vcppo_trl.toy.task import make_splits
    from vcppo_trl.toy.tokenizer import build_tokenizer

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    generator = torch.Generator().manual_seed(rank)
    prompt_lengths = torch.randint(24, 65, (PER_RANK,), generator=generator).tolist()
    response_lengths = [args.response_length] * PER_RANK
    pair = token_budget.build_pair(64 + args.response_length + 8, args.hidden, args.layers, args.heads)
    backend = args.worker
    config = PPOConfig(
        output_dir=os.path.join(tempfile.gettempdir(), f"backends_benchmark_{backend}"),
        per_device_train_batch_size=ROWS_PER_MICRO_BATCH,
        gradient_accumulation_steps=PER_RANK // ROWS_PER_MICRO_BATCH,
        num_mini_batches=1,
        num_ppo_epochs=1,
        response_length=args.response_length,
        kl_coef=0.0,
        learning_rate=1e-5,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **({"ddp_backend": "gloo"} if backend == "zero3" else {}),
        **({"use_cpu": True} if backend == "fsdp2" else {}),
    )
    trainer = PPOTrainer(
        pair.policy,
        lambda completions, **kwargs: [0.0] * len(completions),
        args=config,
        train_dataset=make_splits(64, 8, seed=0)["train"],
        processing_class=build_tokenizer(),
        value_model=pair.critic,
    )
    trainer._setup_training()
    wrapper = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    rollout = token_budget.build_rollout(prompt_lengths, response_lengths)
    mask = rollout.response_mask
    rollout.values = torch.zeros(mask.shape)
    rollout.logprobs = torch.full(mask.shape, -1.0) * mask
    returns = (rollout.scores[:, None] * mask).float()
    rss_after_setup = memory_kib("VmRSS")
    reset_peak()
    seconds = []
    for i in range(1 + args.updates):
        torch.distributed.barrier()
        started = time.perf_counter()
        trainer.learner.update(rollout, returns, returns, value_cliprange=0.2, update_index=i + 1)
        elapsed = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
        torch.distributed.all_reduce(elapsed, op=torch.distributed.ReduceOp.MAX)  # the slower process's
        if i:
            seconds.append(float(elapsed))
    result = {
        "backend": backend,
        "deepspeed": trainer.is_deepspeed_enabled,
        "fsdp2": trainer.is_fsdp2,
        "seconds": seconds,
        "rss_after_setup_mib": rss_after_setup / 1024,
        "peak_rss_in_updates_mib": memory_kib("VmHWM") / 1024,
        "local_parameters": local_elements(wrapper),
        "total_parameters": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in wrapper.parameters()),
    }
    with open(f"{args.out}.rank{rank}", "w") as f:
        json.dump(result, f)
    trainer.accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


def launch(args: argparse.Namespace, backend: str, out: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), env.get("PYTHONPATH", "")]))
    if backend == "ddp":
        env["ACCELERATE_USE_CPU"] = "1"
        start = ["torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    else:
        config = os.path.join(REPO, "configs", "accelerate", f"{backend}_cpu.yaml")
        start = ["accelerate.commands.accelerate_cli", "launch", "--config_file", config, "--main_process_port", "0"]
    cmd = [
        sys.executable,
        "-m",
        *start,
        os.path.abspath(__file__),
        *("--worker", backend, "--out", out, "--updates", str(args.updates)),
        *("--response-length", str(args.response_length), "--hidden", str(args.hidden)),
        *("--layers", str(args.layers), "--heads", str(args.heads)),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    ranks = []
    for rank in (0, 1):
        with open(f"{out}.rank{rank}") as f:
            ranks.append(json.load(f))
    if backend != "ddp" and not (ranks[0]["deepspeed"] or ranks[0]["fsdp2"]):
        raise RuntimeError(f"The {backend} launch ran without sharding: {ranks[0]}")
    return ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--response-length", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat, one timed update")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.updates, args.response_length, args.hidden, args.layers, args.heads = 1, 1, 32, 64, 1, 4
    if args.worker:
        run_worker(args)
        return
    print(
        f"PPOLearner.update on 2 CPU processes (gloo), {PER_RANK} sequences each (responses of {args.response_length} "
        f"tokens), Qwen2 policy + critic of hidden {args.hidden}, {args.layers} layers, float32, 1 torch thread per "
        f"process; {args.repeats} repeat(s) × {args.updates} timed update(s) after 1 warm-up, backends rotating.",
        flush=True,
    )
    runs: dict[str, list[list[dict]]] = {b: [] for b in BACKENDS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = BACKENDS[repeat % 3 :] + BACKENDS[: repeat % 3]
            for backend in order:
                runs[backend].append(launch(args, backend, os.path.join(tmp, f"{backend}{repeat}.json")))
            print(f"  done: repeat {repeat + 1}/{args.repeats} ({', '.join(order)})", flush=True)
    zero3 = statistics.median(t for ranks in runs["zero3"] for t in ranks[0]["seconds"])
    header = (
        f"{'backend':>8} {'s/update':>9} {'vs ZeRO-3':>10} {'params held/process':>20} "
        f"{'RSS after setup MiB (r0/r1)':>28} {'peak RSS in updates MiB (r0/r1)':>32}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for backend in BACKENDS:
        seconds = statistics.median(t for ranks in runs[backend] for t in ranks[0]["seconds"])
        first = runs[backend][0]
        held = f"{first[0]['local_parameters']:,} of {first[0]['total_parameters']:,}"
        setup = "/".join(
            f"{statistics.median(r[i]['rss_after_setup_mib'] for r in runs[backend]):.0f}" for i in (0, 1)
        )
        peak = "/".join(
            f"{statistics.median(r[i]['peak_rss_in_updates_mib'] for r in runs[backend]):.0f}" for i in (0, 1)
        )
        print(f"{backend:>8} {seconds:>9.3f} {seconds / zero3:>10.2f} {held:>20} {setup:>28} {peak:>32}")
    print("\nraw seconds per update (slower process):")
    for backend in BACKENDS:
        print(f"  {backend}: " + " ".join(f"{t:.3f}" for ranks in runs[backend] for t in ranks[0]["seconds"]))


if __name__ == "__main__":
    main()
