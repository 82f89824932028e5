/*
 * NVIDIA's plugin's start-up NVML calls, from a process of no Python: what the fake NVML costs a Go
 * program by itself (tests/bench/bench_compare.py, NVIDIA's column).
 *
 *     nvmlstart LIBRARY
 *
 * The fake libnvidia-ml.so.1 starts a Python interpreter in any process that loads it without one
 * and answers from a Python stand-in. NVIDIA's gpu-kubelet-plugin (v0.4.1) makes these calls at
 * start, per GPU and in these numbers (traced from the stand-in's own call counts over 128 GPUs):
 * init and shutdown twice, the handle by index and twice by UUID, name, minor number and MIG mode
 * twice, PCI info twice, UUID, memory, architecture, brand, CUDA capability, addressing mode,
 * index, whether the handle is a MIG device's, the driver and CUDA driver versions, and the GPU
 * instance profile info of every profile and, twice, the placements of each profile that exists. This
 * program makes the same calls through dlopen, as go-nvml does, then prints the calls made, the
 * calls that failed, and its peak resident memory in KiB (VmHWM): with the fake library, about
 * that of the interpreter and the stand-in the plugin carries. nvml.h is go-nvml's, whose handles
 * are structures holding the pointer, as its Go bindings pass them.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "nvml.h"

/* More placements than any GPU instance profile has. */
enum { MAX_PLACEMENTS = 32 };

static void *lib;
static unsigned made, failed;

#define CALL(name, ...)                                                                 \
    do {                                                                                \
        static __typeof__(name) *fn;                                                    \
        if (!fn) fn = (__typeof__(name) *)dlsym(lib, #name);                            \
        made++;                                                                         \
        if (!fn || fn(__VA_ARGS__) != NVML_SUCCESS) failed++;                           \
    } while (0)

static long peak_kib(void) {
    char line[256];
    long kib = -1;
    FILE *status = fopen("/proc/self/status", "r");
    while (status && fgets(line, sizeof line, status)) {
        if (sscanf(line, "VmHWM: %ld", &kib) == 1) break;
    }
    if (status) fclose(status);
    return kib;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: nvmlstart LIBRARY\n");
        return 2;
    }
    lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    unsigned count = 0, value = 0, pending = 0;
    int major = 0, minor = 0;
    CALL(nvmlInitWithFlags, 0);
    CALL(nvmlSystemGetDriverVersion, text, sizeof text);
    CALL(nvmlDeviceGetCount_v2, &count);
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t gpu = {0}, again = {0};
        nvmlMemory_t memory;
        nvmlPciInfo_t pci;
        nvmlDeviceAddressingMode_t mode = {.version = nvmlDeviceAddressingMode_v1};
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = "";
        for (int twice = 0; twice < 2; twice++) CALL(nvmlInit_v2);
        CALL(nvmlDeviceGetHandleByIndex_v2, i, &gpu);
        CALL(nvmlDeviceGetUUID, gpu, uuid, sizeof uuid);
        for (int twice = 0; twice < 2; twice++) {
            CALL(nvmlDeviceGetHandleByUUID, uuid, &again);
            CALL(nvmlDeviceGetName, gpu, text, sizeof text);
            CALL(nvmlDeviceGetMinorNumber, gpu, &value);
            CALL(nvmlDeviceGetMigMode, gpu, &value, &pending);
            CALL(nvmlDeviceGetPciInfo_v3, gpu, &pci);
        }
        CALL(nvmlDeviceGetIndex, gpu, &value);
        CALL(nvmlDeviceIsMigDeviceHandle, gpu, &value);
        CALL(nvmlDeviceGetMemoryInfo, gpu, &memory);
        CALL(nvmlDeviceGetArchitecture, gpu, &value);
        CALL(nvmlDeviceGetBrand, gpu, (nvmlBrandType_t *)&value);
        CALL(nvmlDeviceGetCudaComputeCapability, gpu, &major, &minor);
        CALL(nvmlDeviceGetAddressingMode, gpu, &mode);
        CALL(nvmlSystemGetDriverVersion, text, sizeof text);
        CALL(nvmlSystemGetCudaDriverVersion, &major);
        for (unsigned profile = 0; profile < NVML_GPU_INSTANCE_PROFILE_COUNT; profile++) {
            nvmlGpuInstanceProfileInfo_t info;
            nvmlGpuInstancePlacement_t placements[MAX_PLACEMENTS];
            unsigned placed = MAX_PLACEMENTS;
            unsigned before = failed;
            CALL(nvmlDeviceGetGpuInstanceProfileInfo, gpu, profile, &info);
            for (int twice = 0; twice < 2 && failed == before; twice++) {
                CALL(nvmlDeviceGetGpuInstancePossiblePlacements_v2, gpu, info.id, placements, &placed);
            }
        }
        for (int twice = 0; twice < 2; twice++) CALL(nvmlShutdown);
    }
    printf("%u %u %ld\n", made, failed, peak_kib());
    return 0;
}
