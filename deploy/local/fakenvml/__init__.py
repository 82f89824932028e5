"""The fake NVML: libnvidia-ml.so.1 for machines without a GPU, one truth for every driver that loads it.

``standin`` (with ``abi``, nvml.h's codes and structures, and ``instances``, the GPU- and
compute-instance calls) implements NVML's C functions over the fake GPUs of dra.fakegpus.library;
``library`` builds the shared library that exports every function of nvml.h and jumps to them
(``loader.c``), and ``cabi`` routes its functions to a stand-in; ``node`` lays out the tree a
driver is started on (driver root, sysfs, procfs), ``host`` its sysfs and procfs, and ``smi`` the
nvidia-smi commands drivers run on the host.

Rule: test and benchmark tooling, never installed with the package; it imports dra (the fakes it
stands on) and localcluster.binaries (the cache and the Go module of NVIDIA's plugin), and only
dra.gpu.nvml of dra knows pynvml.
"""
