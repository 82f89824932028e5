#!/usr/bin/env bash
# The real nvidia-cuda-mps-control on the paths dra-gpu uses (dra/kubeletplugin/mps.py): start, a
# second start, each client command, a CUDA client, quit, and a client with no daemon. Its output is
# what dra/fakegpus/mpscontrol.py must answer (tests/data/real/). Needs a GPU; changes no GPU setting.
set -u
mps=$(command -v nvidia-cuda-mps-control) || { echo "nvidia-cuda-mps-control: not installed"; exit 0; }
work=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY=$work/pipe CUDA_MPS_LOG_DIRECTORY=$work/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
step() { echo "### $*"; }
client() { step "client: $1"; printf '%s\n' "$1" | timeout 20 "$mps"; echo "rc=$?"; }
files() { step "files"; ls -la "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" /dev/shm; }
logs() { step "logs"; tail -n 40 "$CUDA_MPS_LOG_DIRECTORY"/*.log; }
step "binary: $mps"; find "$(dirname "$mps")" -maxdepth 1 -name "*mps*"
step "-h"; timeout 10 "$mps" -h 2>&1 | head -40; echo "rc=$?"
step "client without daemon"; client get_server_list
step "-d"; timeout 20 "$mps" -d; echo "rc=$?"; sleep 1; files; logs
step "processes"; pgrep -a nvidia-cuda-mps
step "second -d"; timeout 20 "$mps" -d; echo "rc=$?"
for c in get_default_active_thread_percentage "get_default_device_pinned_mem_limit 0" \
    "set_default_device_pinned_mem_limit 0 1536M" "get_default_device_pinned_mem_limit 0" \
    "set_default_device_pinned_mem_limit 0 4096M" "get_default_device_pinned_mem_limit 0" \
    "set_default_active_thread_percentage 50" \
    get_default_active_thread_percentage "set_default_active_thread_percentage 0" \
    "set_default_active_thread_percentage 101" "set_default_active_thread_percentage abc" \
    "set_default_device_pinned_mem_limit 0 2G" "get_default_device_pinned_mem_limit 0" \
    "set_default_device_pinned_mem_limit 0 1024M" "get_default_device_pinned_mem_limit 0" \
    "get_default_device_pinned_mem_limit 5" "set_default_device_pinned_mem_limit 0 2X" \
    "set_default_device_pinned_mem_limit 5 2G" bogus_command get_server_list; do
  client "$c"
done
step "a CUDA client"
timeout 90 python3 -c "import torch; x = torch.ones(4, device='cuda'); print('sum', x.sum().item())" 2>&1 | tail -5
echo "rc=$?"
files; client get_server_list; step "processes"; pgrep -a nvidia-cuda-mps
step "quit"; client quit; sleep 2; files; step "processes after quit"; pgrep -a nvidia-cuda-mps; logs
step "-d -M"; timeout 20 "$mps" -d -M; echo "rc=$?"; sleep 1; files; logs; client quit; sleep 1
step "-d with CUDA_VISIBLE_DEVICES=0"; CUDA_VISIBLE_DEVICES=0 timeout 20 "$mps" -d; echo "rc=$?"; sleep 1; logs
client "get_default_device_pinned_mem_limit 1"; client quit; sleep 1
step "processes at the end"; pgrep -a nvidia-cuda-mps
exit 0
