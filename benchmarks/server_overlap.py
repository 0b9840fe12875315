"""Benchmark: server-mode training with bounded staleness (`vllm_mode="server"`, `max_staleness=1`) against the
synchronous server run (`max_staleness=0`): how long the trainer sits idle waiting for the server.

    .venv-vllm/bin/python benchmarks/server_overlap.py            # T = 256 (minutes); needs vLLM (the CPU build here)
    .venv-vllm/bin/python benchmarks/server_overlap.py --smoke    # the code paths at T = 16, not the timings

Starts one vLLM server (`python -m vllm.entrypoints.openai.api_server`, float32, `VLLM_SERVER_DEV_MODE=1`, one OpenMP
thread) on `step_setup`'s policy shape with 2 attention heads (the CPU backend's head size) and the stop token in
its vocabulary (vLLM refuses a stop token outside it, so responses end when the random policy samples it: the mean
length is printed), and trains `overlap.py`'s update on it (batch 8, KL 0, the
on-policy shortcut, the trainer on one torch thread), the weights pushed through the shared folder after every policy
update. Sides, rotated per repeat: `sync` (sample on the server, then learn) and `s1` (the server samples batch k+1
while update k trains).

Printed (medians over repeats of the medians over timed updates): seconds per update; the trainer's seconds per update
away from its own update, waiting on the server or pushing to it (`sync`: the generation and the weight sync before it,
`time/generation_s` + `time/weight_sync_s`; `s1`: its wait for samples and the staging of the push,
`perf/rollout_wait_s` + `time/weight_push_s`) and their share of the update; the speed-up (updates per second,
s1 / sync).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import step_setup  # noqa: E402
import torch  # noqa: E402
from windows import timed_training  # noqa: E402

BATCH = 8
PROMPT_TOKENS = 16  # step_setup's prompts are shorter


def vllm_ready_policy(response_length: int, seed: int = 0):
    """`step_setup`'s policy shape with 2 heads of 32 (vLLM's CPU attention takes such head sizes) and the stop token
    in the vocabulary."""
    from transformers import Qwen2ForCausalLM

    config = step_setup.model_config(response_length + PROMPT_TOKENS, vocab_size=step_setup.MODEL_VOCAB + 1)
    config.num_attention_heads = config.num_key_value_heads = 2
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model_dir: str, max_model_len: int, extra_args: tuple[str, ...] = (), env: dict | None = None):
    """A vLLM server on `model_dir` for the run (the CPU build's settings unless `extra_args`/`env` say otherwise);
    stopped with its engine process at the end."""
    port = free_port()
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1", **(env or {}))
    log = open(os.path.join(model_dir, "server.log"), "w")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--dtype", "float32", "--max-model-len", str(max_model_len)]
    command += ["--generation-config", "vllm", "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1"]
    command += list(extra_args)
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"The vLLM server did not come up; see {log.name}")
            with contextlib.suppress(Exception):
                if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                    break
            time.sleep(2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def run_side(
    url: str, response_length: int, max_staleness: int, updates: int, warmup: int, seed: int = 0, **overrides
) -> dict:
    """Train `warmup + updates` updates on the server at `url`; the timed updates' medians (`overrides`: config fields
    on top, e.g. the device and the weight transfer of the GPU check's row)."""
    from datasets import Dataset
    from step_ours import vcppo_update_config

    tokenizer = step_setup.build_tokenizer()
    num_prompts = BATCH * (warmup + updates + max_staleness)
    dataset = Dataset.from_dict({"prompt": step_setup.prompt_texts(num_prompts, seed)})
    with tempfile.TemporaryDirectory() as output_dir:
        config = vcppo_update_config(
            output_dir,
            batch=BATCH,
            response_length=response_length,
            updates=warmup + updates,
            seed=seed,
            max_staleness=max_staleness,
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=url,
            vllm_server_timeout=120.0,
            **overrides,
        )
        policy = vllm_ready_policy(response_length, seed)
        seconds, timed = timed_training(policy, tokenizer, dataset, config, warmup)
    update = statistics.median(seconds)
    length = statistics.mean(m["completions/mean_length"] for m in timed)
    gap = max(m["sampling/sampling_logp_difference/max"] for m in timed)
    if max_staleness:
        idle = statistics.median(m["perf/rollout_wait_s"] + m["time/weight_push_s"] for m in timed)
        staleness = max(m["sampling/staleness_max"] for m in timed)
    else:
        idle = statistics.median(m["time/generation_s"] + m["time/weight_sync_s"] for m in timed)
        staleness = 0
    return {"update_s": update, "idle_s": idle, "staleness": staleness, "length": length, "logp_gap_max": gap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.length, args.repeats, args.updates, args.warmup = 16, 1, 2, 1
    torch.set_num_threads(1)
    print(
        f"Every response at T={args.length}, batch {BATCH}, {args.repeats} repeat(s) × {args.updates} timed update(s) "
        f"after {args.warmup} warm-up per side; trainer 1 torch thread, server 1 OpenMP thread; medians.",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as model_dir:
        vllm_ready_policy(args.length).save_pretrained(model_dir)
        step_setup.build_tokenizer().save_pretrained(model_dir)
        start = time.perf_counter()
        with vllm_server(model_dir, PROMPT_TOKENS + args.length) as url:
            print(f"server up in {time.perf_counter() - start:.0f} s", flush=True)
            sides = {"sync": 0, "s1": 1}
            runs = {side: [] for side in sides}
            order = list(sides)
            for repeat in range(args.repeats):
                for side in order[repeat % 2 :] + order[: repeat % 2]:
                    runs[side].append(run_side(url, args.length, sides[side], args.updates, args.warmup))
                print(f"  done: repeat {repeat + 1}/{args.repeats}", flush=True)
    median = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    print(f"{'side':<6} {'upd s':>7} {'idle s':>7} {'idle %':>7} {'staleness':>9} {'length':>7}")
    for side in order:
        m = median[side]
        print(
            f"{side:<6} {m['update_s']:7.3f} {m['idle_s']:7.3f} {100 * m['idle_s'] / m['update_s']:7.1f} "
            f"{int(m['staleness']):9d} {m['length']:7.1f}"
        )
    print(f"speed-up (updates/s, s1 / sync): {median['sync']['update_s'] / median['s1']['update_s']:.2f}")


if __name__ == "__main__":
    main()
