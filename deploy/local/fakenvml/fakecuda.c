/*
 * A fake CUDA driver library: libcuda.so.1 for containers given dra-gpu's fake GPUs.
 *
 * It answers the calls a program makes to find its GPUs, for the GPUs and MIG devices
 * whose device nodes the calling process has, as the real driver enumerates what a
 * container was given. Behaviour, from the CUDA Driver API reference
 * (docs.nvidia.com/cuda/cuda-driver-api, "Initialization", "Version Management",
 * "Device Management"):
 *
 * - cuInit(flags): flags must be 0 (CUDA_ERROR_INVALID_VALUE); with no device the
 *   process can use, CUDA_ERROR_NO_DEVICE. Every other call but cuDriverGetVersion
 *   answers CUDA_ERROR_NOT_INITIALIZED before a successful cuInit.
 * - cuDriverGetVersion(int *): the CUDA version the driver supports, 1000 * major +
 *   10 * minor (12040 is 12.4); works before cuInit.
 * - cuDeviceGetCount(int *), cuDeviceGet(CUdevice *, ordinal): ordinals 0..count-1,
 *   CUDA_ERROR_INVALID_DEVICE outside them.
 * - cuDeviceGetName(char *, len, dev): the product name, truncated to len - 1 and
 *   terminated; a MIG device is "<GPU's product> MIG <profile>".
 * - cuDeviceGetUuid(_v2)(CUuuid *, dev): the 16 bytes of the GPU's UUID, or of the MIG
 *   device's for a MIG device (CUDA >= 11.4 reports MIG devices by their own UUID).
 * - cuDeviceTotalMem(_v2)(size_t *, dev): the memory of the GPU or of the MIG device.
 * - NULL output pointers: CUDA_ERROR_INVALID_VALUE.
 *
 * Enumeration, as the driver does it in a container: a GPU counts when its
 * /dev/nvidia<minor> is there for this process (the real driver opens it; the fake
 * nodes are inert, so present and accessible for reading and writing stands in);
 * a GPU in MIG mode is not a CUDA device itself, each of its MIG devices counts
 * when the capability nodes of its GPU instance and compute instance are there
 * too. Without /dev/nvidiactl there is no device at all.
 *
 * The GPUs are the fake driver's one table, which its nvidia-smi carries
 * (dra/fakegpus/node.py): `TABLE='...'` in /usr/bin/nvidia-smi, one device a line:
 *   V <CUDA version>
 *   G <minor> <uuid> <memory bytes> <product>
 *   M <GPU's minor> <GI cap minor> <CI cap minor> <uuid> <memory bytes> <profile>
 * so nvidia-smi -L and CUDA list the same devices.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101

#define EXPORTED __attribute__((visibility("default")))
#define MAX_DEVICES 64
#define SMI "/usr/bin/nvidia-smi"

typedef int CUresult;
typedef int CUdevice;
typedef struct { char bytes[16]; } CUuuid;

struct device {
    char name[128];
    unsigned char uuid[16];
    size_t memory;
};

static struct device devices[MAX_DEVICES];
static int count;
static int initialised;
static int cuda_version;

/* A line of the table: a GPU (G) or a MIG device (M) of the GPU with minor `parent`. */
struct entry {
    char kind;
    int minor, parent, gi, ci;
    char uuid[64];
    char name[96];
    size_t memory;
};

static struct entry entries[2 * MAX_DEVICES];
static int nentries;

static int usable(const char *path) { return access(path, R_OK | W_OK) == 0; }

static int parse_uuid(const char *text, unsigned char *out) {
    /* GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx or MIG-...: 32 hex digits after the prefix. */
    const char *p = strchr(text, '-');
    int n = 0;
    if (p == NULL) return -1;
    for (p++; *p && n < 32; p++) {
        unsigned v;
        if (*p == '-') continue;
        if (sscanf(p, "%1x", &v) != 1) return -1;
        if (n % 2 == 0) out[n / 2] = (unsigned char)(v << 4);
        else out[n / 2] |= (unsigned char)v;
        n++;
    }
    return n == 32 ? 0 : -1;
}

static void add(const char *name, const char *uuid, size_t memory) {
    struct device *d;
    if (count == MAX_DEVICES) return;
    d = &devices[count];
    snprintf(d->name, sizeof d->name, "%s", name);
    if (parse_uuid(uuid, d->uuid) != 0) return;
    d->memory = memory;
    count++;
}

/* The table's lines, from nvidia-smi's TABLE='...'; NULL when there is none. */
static char *read_table(void) {
    FILE *f = fopen(SMI, "r");
    char *text = NULL, *start, *end;
    size_t size = 0;
    if (f == NULL) return NULL;
    if (getdelim(&text, &size, '\0', f) < 0) {
        fclose(f);
        free(text);
        return NULL;
    }
    fclose(f);
    start = strstr(text, "\nTABLE='");
    end = start ? strchr(start + 8, '\'') : NULL;
    if (end == NULL) {
        free(text);
        return NULL;
    }
    *end = '\0';
    memmove(text, start + 8, (size_t)(end - start - 8) + 1);
    return text;
}

static void parse(char *table) {
    char *line, *save = NULL;
    nentries = 0;
    for (line = strtok_r(table, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        struct entry *e = &entries[nentries];
        unsigned long long memory;
        int offset = 0;
        if (sscanf(line, "V %d", &cuda_version) == 1 || nentries == 2 * MAX_DEVICES) continue;
        if (sscanf(line, "G %d %63s %llu %n", &e->minor, e->uuid, &memory, &offset) == 3 && offset)
            e->kind = 'G';
        else if (sscanf(line, "M %d %d %d %63s %llu %n", &e->parent, &e->gi, &e->ci, e->uuid, &memory,
                        &offset) == 5 && offset)
            e->kind = 'M';
        else
            continue;
        snprintf(e->name, sizeof e->name, "%s", line + offset);
        e->memory = (size_t)memory;
        nentries++;
    }
}

static void enumerate(void) {
    char path[64], cap[64], name[200];
    int i, j;
    for (i = 0; i < nentries; i++) {
        const struct entry *g = &entries[i];
        int mig = 0;
        if (g->kind != 'G') continue;
        snprintf(path, sizeof path, "/dev/nvidia%d", g->minor);
        if (!usable(path)) continue;
        for (j = 0; j < nentries; j++) {
            const struct entry *m = &entries[j];
            if (m->kind != 'M' || m->parent != g->minor) continue;
            mig = 1;
            snprintf(path, sizeof path, "/dev/nvidia-caps/nvidia-cap%d", m->gi);
            snprintf(cap, sizeof cap, "/dev/nvidia-caps/nvidia-cap%d", m->ci);
            if (!usable(path) || !usable(cap)) continue;
            snprintf(name, sizeof name, "%s MIG %s", g->name, m->name);
            add(name, m->uuid, m->memory);
        }
        if (!mig) add(g->name, g->uuid, g->memory);
    }
}

static void load(void) {
    char *table;
    if (nentries > 0 || cuda_version > 0 || (table = read_table()) == NULL) return;
    parse(table);
    free(table);
}

EXPORTED CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (initialised) return CUDA_SUCCESS;
    count = 0;
    load();
    if (usable("/dev/nvidiactl")) enumerate();
    if (count == 0) return CUDA_ERROR_NO_DEVICE;
    initialised = 1;
    return CUDA_SUCCESS;
}

EXPORTED CUresult cuDriverGetVersion(int *version) {
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    load();
    *version = cuda_version;
    return CUDA_SUCCESS;
}

EXPORTED CUresult cuDeviceGetCount(int *n) {
    if (n == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *n = count;
    return CUDA_SUCCESS;
}

static CUresult check(CUdevice dev) {
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED;
    return dev >= 0 && dev < count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORTED CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    CUresult r;
    if (dev == NULL) return CUDA_ERROR_INVALID_VALUE;
    if ((r = check(ordinal)) != CUDA_SUCCESS) return r;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

EXPORTED CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    CUresult r;
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if ((r = check(dev)) != CUDA_SUCCESS) return r;
    snprintf(name, (size_t)len, "%s", devices[dev].name);
    return CUDA_SUCCESS;
}

EXPORTED CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    CUresult r;
    if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
    if ((r = check(dev)) != CUDA_SUCCESS) return r;
    memcpy(uuid->bytes, devices[dev].uuid, 16);
    return CUDA_SUCCESS;
}

EXPORTED CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

EXPORTED CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult r;
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    if ((r = check(dev)) != CUDA_SUCCESS) return r;
    *bytes = devices[dev].memory;
    return CUDA_SUCCESS;
}

/* The CUDA 3.0 entry point (cuda.h maps cuDeviceTotalMem to _v2 since 3.2): 32 bits, clamped. */
EXPORTED CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    size_t full;
    CUresult r = cuDeviceTotalMem_v2(bytes ? &full : NULL, dev);
    if (r == CUDA_SUCCESS) *bytes = full > 0xffffffffu ? 0xffffffffu : (unsigned int)full;
    return r;
}
