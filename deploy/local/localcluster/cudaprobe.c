/*
 * cudaprobe: what a CUDA program finds of its driver, the way CUDA's runtime and NVML
 * users find it: dlopen of libcuda.so.1 and libnvidia-ml.so.1 by SONAME (the loader's
 * search: LD_LIBRARY_PATH, /etc/ld.so.cache, its default folders), then the driver API
 * calls that enumerate the devices. One `key: value` a line, on stdout or into the file
 * argv[1] names (an image without a shell has nothing else to record it with):
 *
 *   libcuda.so.1: <the file the loader mapped>          (or "libcuda.so.1: error <dlerror>")
 *   libnvidia-ml.so.1: <the file the loader mapped>
 *   cuDriverGetVersion: <version>
 *   cuInit: <CUresult>
 *   cuDeviceGetCount: <count>
 *   device <ordinal>: <UUID> <total memory bytes> <name>
 *
 * A device's UUID is written as nvidia-smi writes it, GPU-... or MIG-... (a MIG
 * device's name says MIG). Exit status 0 when both libraries load and cuInit succeeds.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

typedef int (*init_t)(unsigned);
typedef int (*int_out_t)(int *);
typedef int (*get_t)(int *, int);
typedef int (*name_t)(char *, int, int);
typedef int (*uuid_t_)(unsigned char *, int);
typedef int (*mem_t)(size_t *, int);

static const char *mapped(void *handle) {
    struct link_map *map = NULL;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL) return "?";
    return map->l_name;
}

static void *open_library(FILE *out, const char *soname) {
    void *handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
        fprintf(out, "%s: error %s\n", soname, dlerror());
    else
        fprintf(out, "%s: %s\n", soname, mapped(handle));
    return handle;
}

int main(int argc, char **argv) {
    FILE *out = argc > 1 ? fopen(argv[1], "w") : stdout;
    void *cuda, *nvml;
    int version = 0, count = 0, result, i;
    if (out == NULL) {
        perror(argv[1]);
        return 2;
    }
    cuda = open_library(out, "libcuda.so.1");
    nvml = open_library(out, "libnvidia-ml.so.1");
    if (cuda == NULL || nvml == NULL) return 1;
    ((int_out_t)dlsym(cuda, "cuDriverGetVersion"))(&version);
    fprintf(out, "cuDriverGetVersion: %d\n", version);
    result = ((init_t)dlsym(cuda, "cuInit"))(0);
    fprintf(out, "cuInit: %d\n", result);
    if (result != 0) return 1;
    ((int_out_t)dlsym(cuda, "cuDeviceGetCount"))(&count);
    fprintf(out, "cuDeviceGetCount: %d\n", count);
    for (i = 0; i < count; i++) {
        int dev = -1, j;
        char name[256] = "";
        unsigned char uuid[16] = {0};
        size_t memory = 0;
        ((get_t)dlsym(cuda, "cuDeviceGet"))(&dev, i);
        ((name_t)dlsym(cuda, "cuDeviceGetName"))(name, sizeof name, dev);
        ((uuid_t_)dlsym(cuda, "cuDeviceGetUuid_v2"))(uuid, dev);
        ((mem_t)dlsym(cuda, "cuDeviceTotalMem_v2"))(&memory, dev);
        fprintf(out, "device %d: %s-", i, strstr(name, " MIG ") ? "MIG" : "GPU");
        for (j = 0; j < 16; j++) fprintf(out, "%02x%s", uuid[j], j == 3 || j == 5 || j == 7 || j == 9 ? "-" : "");
        fprintf(out, " %zu %s\n", memory, name);
    }
    return fclose(out) == 0 ? 0 : 2;
}
