/*
 * The fake NVML's loader: libnvidia-ml.so.1 for processes on a machine without a GPU.
 *
 * Every function of nvml.h is exported (library.py generates those symbols from the
 * header NVIDIA's plugin is built with). Each is a jump through a slot of
 * fakenvml_slot: to the NVML stand-in's function (fakenvml.standin, Python) once a
 * stand-in is installed, else to a stub that asks fakenvml_resolve where to go. So
 * one truth answers every caller, pynvml in the driver's own process and go-nvml in
 * NVIDIA's: the stand-in over the fake GPUs of dra.fakegpus.library.
 *
 * A process that loads this library without Python (NVIDIA's Go plugin) gets one:
 * on the first call the loader reads fakenvml.conf beside the library, loads the
 * libpython it names, starts the interpreter and has fakenvml.cabi install the
 * stand-in the configuration describes. A Python process (pynvml) already has an
 * interpreter; the same configuration is read in it, or a test installs a stand-in
 * itself (fakenvml.cabi.install) before the first call.
 *
 * Nothing here links against libpython: its functions are looked up with dlsym,
 * and only those of the stable ABI are used, so one build serves every Python 3.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* nvmlReturn_t values (nvml.h). */
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_FUNCTION_NOT_FOUND 13

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORTED __attribute__((visibility("default")))

/* The generated part: the names of nvml.h's functions, their slots and their stubs. */
extern HIDDEN const unsigned fakenvml_total;
extern HIDDEN const char *const fakenvml_names[];
extern HIDDEN void *fakenvml_slot[];
extern HIDDEN void *const fakenvml_stub[];

static pthread_once_t configured = PTHREAD_ONCE_INIT;
/* Set once a stand-in answers: from then on a stub means "not implemented". */
static int installed;
static unsigned char *reported;
/* fakenvml.unsupported beside the library: each process appends "<program> <function>" once for
 * every function it called that answers NOT_SUPPORTED, so that a test can say what a caller
 * (NVIDIA's plugin) asked of the stand-in and did not get. */
static char unsupported_log[PATH_MAX + 32];

static int not_supported(void) { return NVML_ERROR_NOT_SUPPORTED; }
static int driver_not_loaded(void) { return NVML_ERROR_DRIVER_NOT_LOADED; }
static const char *no_error_string(void) { return "Unknown Error (the fake NVML has no stand-in)"; }

/* What a driver that lacks a function answers through pynvml and go-nvml alike. */
EXPORTED int fakenvml_function_not_found(void) { return NVML_ERROR_FUNCTION_NOT_FOUND; }

EXPORTED unsigned fakenvml_count(void) { return fakenvml_total; }

EXPORTED const char *fakenvml_name(unsigned index) {
    return index < fakenvml_total ? fakenvml_names[index] : NULL;
}

/* Route function `index` to `target`; NULL makes it a stub again (not implemented). */
EXPORTED void fakenvml_route(unsigned index, void *target) {
    if (index < fakenvml_total) {
        __atomic_store_n(&fakenvml_slot[index], target ? target : fakenvml_stub[index], __ATOMIC_RELEASE);
    }
}

/* Whether a stand-in answers: with none, every call answers DRIVER_NOT_LOADED, as NVML without its driver. */
EXPORTED void fakenvml_set_installed(int on) { __atomic_store_n(&installed, on, __ATOMIC_RELEASE); }

typedef int (*py_int_void)(void);
typedef void (*py_void_int)(int);
typedef void *(*py_ptr_void)(void);
typedef int (*py_gil_ensure)(void);
typedef void (*py_gil_release)(int);
typedef int (*py_run)(const char *, void *);

static void *python_function(const char *name) {
    void *found = dlsym(RTLD_DEFAULT, name);
    if (found == NULL) {
        fprintf(stderr, "fakenvml: %s not found in the loaded libpython\n", name);
    }
    return found;
}

/* The directory this library was loaded from, as the loader found it (symbolic links not followed). */
static int own_directory(char *out, size_t size) {
    Dl_info info;
    if (dladdr((void *)fakenvml_count, &info) == 0 || info.dli_fname == NULL) {
        return -1;
    }
    const char *slash = strrchr(info.dli_fname, '/');
    size_t length = slash ? (size_t)(slash - info.dli_fname) : 1;
    if (length + 1 > size) {
        return -1;
    }
    memcpy(out, slash ? info.dli_fname : ".", length);
    out[length] = '\0';
    return 0;
}

/* The value of `key=` in the configuration, or an empty string. */
static void conf_value(FILE *conf, const char *key, char *out, size_t size) {
    char line[PATH_MAX * 4];
    size_t key_length = strlen(key);
    out[0] = '\0';
    rewind(conf);
    while (fgets(line, sizeof line, conf) != NULL) {
        if (strncmp(line, key, key_length) == 0 && line[key_length] == '=') {
            line[strcspn(line, "\n")] = '\0';
            snprintf(out, size, "%s", line + key_length + 1);
            return;
        }
    }
}

static void hex(const char *text, char *out, size_t size) {
    size_t i = 0;
    for (; text[i] != '\0' && 2 * i + 2 < size; i++) {
        snprintf(out + 2 * i, 3, "%02x", (unsigned char)text[i]);
    }
    out[2 * i] = '\0';
}

/* Start Python if the process has none, and let fakenvml.cabi install the configured stand-in. */
static void configure(void) {
    char directory[PATH_MAX], path[PATH_MAX + 32], libpython[PATH_MAX];
    reported = calloc(fakenvml_total, 1);
    if (own_directory(directory, sizeof directory) != 0) {
        return;
    }
    snprintf(unsupported_log, sizeof unsupported_log, "%s/fakenvml.unsupported", directory);
    snprintf(path, sizeof path, "%s/fakenvml.conf", directory);
    FILE *conf = fopen(path, "r");
    if (conf == NULL) {
        return; /* unconfigured: a test installs its stand-in itself */
    }
    conf_value(conf, "libpython", libpython, sizeof libpython);
    fclose(conf);
    if (dlsym(RTLD_DEFAULT, "Py_IsInitialized") == NULL) {
        if (libpython[0] == '\0' || dlopen(libpython, RTLD_NOW | RTLD_GLOBAL) == NULL) {
            fprintf(stderr, "fakenvml: cannot load libpython %s from %s: %s\n", libpython, path, dlerror());
            return;
        }
    }
    py_int_void is_initialized = (py_int_void)python_function("Py_IsInitialized");
    py_void_int initialize = (py_void_int)python_function("Py_InitializeEx");
    py_ptr_void save_thread = (py_ptr_void)python_function("PyEval_SaveThread");
    py_gil_ensure ensure = (py_gil_ensure)python_function("PyGILState_Ensure");
    py_gil_release release = (py_gil_release)python_function("PyGILState_Release");
    py_run run = (py_run)python_function("PyRun_SimpleStringFlags");
    if (!is_initialized || !initialize || !save_thread || !ensure || !release || !run) {
        return;
    }
    if (!is_initialized()) {
        /* No signal handlers: the host program (NVIDIA's plugin, a Go program) keeps its own. */
        initialize(0);
        save_thread();
    }
    char path_hex[sizeof path * 2 + 1];
    hex(path, path_hex, sizeof path_hex);
    int state = ensure();
    /* The package is not on sys.path yet: the configuration says where it is (pythonpath=). */
    char boot[sizeof path_hex + 512];
    snprintf(boot, sizeof boot,
             "def _fakenvml_start(conf):\n"
             "    import sys\n"
             "    for line in open(conf):\n"
             "        key, _, value = line.rstrip('\\n').partition('=')\n"
             "        if key == 'pythonpath':\n"
             "            sys.path[:0] = [p for p in value.split(':') if p and p not in sys.path]\n"
             "    import fakenvml.cabi\n"
             "    fakenvml.cabi.serve(conf)\n"
             "try:\n"
             "    _fakenvml_start(bytes.fromhex('%s').decode())\n"
             "finally:\n"
             "    del _fakenvml_start\n",
             path_hex);
    if (run(boot, NULL) != 0) {
        fprintf(stderr, "fakenvml: the stand-in configured in %s did not start (the Python error is above)\n", path);
    }
    release(state);
}

/* One line in fakenvml.unsupported, in one write(2) with O_APPEND: lines of processes do not mix. */
static void record_unsupported(const char *name) {
    if (unsupported_log[0] == '\0') {
        return;
    }
    char line[512];
    int length = snprintf(line, sizeof line, "%s %s\n", program_invocation_short_name, name);
    int fd = open(unsupported_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "fakenvml: cannot record in %s: %s\n", unsupported_log, strerror(errno));
        return;
    }
    if (length > 0 && (size_t)length < sizeof line && write(fd, line, (size_t)length) != length) {
        fprintf(stderr, "fakenvml: cannot record in %s: %s\n", unsupported_log, strerror(errno));
    }
    close(fd);
}

/* Where the stub of function `index` goes: its slot once a stand-in answers, else an error. */
HIDDEN void *fakenvml_resolve(unsigned index) {
    pthread_once(&configured, configure);
    void *target = __atomic_load_n(&fakenvml_slot[index], __ATOMIC_ACQUIRE);
    int error_string = strcmp(fakenvml_names[index], "nvmlErrorString") == 0;
    if (target != fakenvml_stub[index]) {
        return target;
    }
    if (!__atomic_load_n(&installed, __ATOMIC_ACQUIRE)) {
        return error_string ? (void *)no_error_string : (void *)driver_not_loaded;
    }
    if (reported != NULL && !__atomic_exchange_n(&reported[index], 1, __ATOMIC_RELAXED)) {
        fprintf(stderr, "fakenvml: %s is not implemented by the NVML stand-in: NOT_SUPPORTED\n",
                fakenvml_names[index]);
        record_unsupported(fakenvml_names[index]);
    }
    return error_string ? (void *)no_error_string : (void *)not_supported;
}
