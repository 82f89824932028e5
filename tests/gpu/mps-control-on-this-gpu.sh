#!/usr/bin/env bash
# The real nvidia-cuda-mps-control, started on this machine's GPUs whatever CUDA_VISIBLE_DEVICES asks:
# the MPS tests' devices are fake GPUs' UUIDs, and the real daemon exits 100, silently, on a device it
# cannot find. The devices asked stay in DRA_GPU_TEST_ASKED_DEVICES for the tests to check
# (tests/unit/helpers.py daemon_devices). For tests/gpu/check.sh only.
set -eu
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  export DRA_GPU_TEST_ASKED_DEVICES=$CUDA_VISIBLE_DEVICES
  CUDA_VISIBLE_DEVICES=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | paste -sd,)
  export CUDA_VISIBLE_DEVICES
fi
exec nvidia-cuda-mps-control "$@"
