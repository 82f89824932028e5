"""dra-gpu: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs."""
