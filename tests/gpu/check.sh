#!/usr/bin/env bash
# Real-GPU checks in one run (docs/testing.md "On a real GPU"): the NVML recording, discovery, the
# gpu-marked tests on real NVML, the real MPS daemon, then the unit suite with a GPU present.
# Run from the repository root: OUT=dir bash tests/gpu/check.sh. Wheels in .whl are installed
# first where the machine has no package index (the GPU machines this project borrows).
set -u
out=${OUT:-/tmp/dra-gpu-check}
mkdir -p "$out"
export PATH=$PATH:/usr/local/nvidia/bin PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD:$PWD/deploy/local
{
  date -u; uname -a; python3 --version; nproc; free -g
  python3 -m pip list 2>/dev/null | grep -iE '^(grpcio|protobuf|anyio|nvidia-ml-py|kubernetes|uvloop|pytest|hypothesis|aiohttp) '
  nvidia-smi -L; cat /proc/driver/nvidia/version
  ls -la /dev/nvidia* /dev/nvidia-caps 2>&1; head -20 /proc/driver/nvidia-caps/mig-minors
  ldconfig -p | grep -E "nvidia|cuda" | head -40; find /usr/local/nvidia -maxdepth 2 | head -80
  python3 - <<'PY'
from dra.gpu.driverfiles import find_driver_files
from pathlib import Path
import pynvml
pynvml.nvmlInit(); version = pynvml.nvmlSystemGetDriverVersion(); pynvml.nvmlShutdown()
for root in ("/", "/usr/local/nvidia"):
    files = find_driver_files(str(version), Path(root))
    print(f"driver files under {root}: {len(files)}")
    for f in files:
        print("  ", f)
PY
} >"$out/env.txt" 2>&1
{
  nvidia-smi -q; nvidia-smi mig -lgip; nvidia-smi mig -lgipp; echo "rc=$?"
  nvidia-smi compute-policy -h; echo "rc=$?"; nvidia-smi compute-policy -l; echo "rc=$?"
  nvidia-smi compute-policy -i GPU-00000000-0000-0000-0000-000000000000 --set-timeslice 2; echo "rc=$?"
} >"$out/nvidia-smi.txt" 2>&1
timeout 120 python3 -m tests.gpu.record "$out/nvml-record.json" >"$out/discover.txt" 2>&1
echo "record rc=$?" >>"$out/discover.txt"
for mode in static dynamic; do
  echo "### dra-gpu discover --mig-mode $mode"
  timeout 60 python3 -m dra discover --output json --node-name gpu-node --mig-mode $mode 2>&1
  echo "rc=$?"
done >>"$out/discover.txt"
{
  nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv
  timeout 120 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/unit
  echo "rc=$?"
  nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv
} >"$out/pytest-gpu.txt" 2>&1
timeout 150 bash tests/gpu/record-mps.sh >"$out/mps.txt" 2>&1
# The usage sampler under a real CUDA load, where python3 has PyTorch to make one.
if python3 -c 'import torch' 2>/dev/null; then
  timeout 120 python3 -m tests.gpu.usage_under_load >>"$out/discover.txt" 2>&1
fi
# The driver's MPS daemons on the real control binary (the tests use the fake where it is absent),
# started on this machine's GPU: the tests' devices are fake ones.
if command -v nvidia-cuda-mps-control >/dev/null; then
  DRA_GPU_TEST_MPS_CONTROL=$PWD/tests/gpu/mps-control-on-this-gpu.sh timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/unit/test_mps.py tests/unit/test_dynamic_mig_state.py -k 'mps or daemon' >"$out/pytest-mps.txt" 2>&1
  echo "rc=$?" >>"$out/pytest-mps.txt"
fi
# The fuzz targets need atheris, too large to carry to a machine without a package index.
skip=(); python3 -c 'import atheris' 2>/dev/null || skip=(--ignore=tests/unit/test_fuzz.py)
timeout "${UNIT_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -m 'not cluster and not containerd' \
  "${skip[@]}" tests/unit >"$out/pytest-unit.txt" 2>&1
echo "rc=$?" >>"$out/pytest-unit.txt"
tail -n 3 "$out"/pytest-*.txt
