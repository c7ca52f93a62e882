#!/usr/bin/env bash
# G1 (../shared/QUALITY.md): on a GPU machine, the trainer with NCCL and bf16 on every visible
# GPU, with ddp and with fsdp (FSDP2 over NCCL when there are 2 GPUs or more); prints samples/s
# and model FLOP utilisation. One prepared script, under 10 minutes.
# Run from the repository root: bash benchmarks/gpu_check.sh [out-folder]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-/tmp}/gpu_check}"
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
timeout 540 "$python" -m benchmarks.gpu_check --out "$out" 2>&1 | tee "$out.log"
