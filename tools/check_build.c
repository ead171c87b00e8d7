#include "tools/check_build.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvd/hvd.h"
#ifdef HVD_WITH_MPI
#include "transport/mpi/mpi.h"
#endif
#ifdef HVD_WITH_VERBS
#include "transport/verbs/lib.h"
#endif

/* 1 if the first dirlen bytes of dir, "/" and name make the path of an
 * executable file; then out holds that path. */
static int executable_at(const char *dir, size_t dirlen, const char *name,
                         char *out, size_t outlen) {
    char path[PATH_MAX];
    int len = snprintf(path, sizeof(path), "%.*s/%s", (int)dirlen, dir, name);

    if (len < 0 || (size_t)len >= sizeof(path) || (size_t)len >= outlen ||
        access(path, X_OK) != 0)
        return 0;
    memcpy(out, path, (size_t)len + 1);
    return 1;
}

/* The Python of the environment this hvdrun was installed into, in out:
 * pip puts hvdrun in the environment's bin/, beside its python3, and a
 * copy of hvdrun inside an installed package (.../lib/pythonX.Y/
 * site-packages/...) has the environment's bin/python3 above it. So
 * venv/bin/hvdrun --check-build, run without activating the environment,
 * asks the interpreter that sees the environment's packages, not the first
 * python3 on PATH. 0 when there is none (a build tree, a system install
 * without a python3 beside it). */
static int python_of_install(char *out, size_t outlen) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    const char *slash, *lib;

    if (n <= 0)
        return 0;
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (slash == NULL)
        return 0;
    if (executable_at(exe, (size_t)(slash - exe), "python3", out, outlen) ||
        executable_at(exe, (size_t)(slash - exe), "python", out, outlen))
        return 1;
    lib = strstr(exe, "/lib/python");
    if (lib != NULL && strstr(lib, "/site-packages/") != NULL) {
        char bin[PATH_MAX];

        if (snprintf(bin, sizeof(bin), "%.*s/bin", (int)(lib - exe), exe) <
                (int)sizeof(bin) &&
            executable_at(bin, strlen(bin), "python3", out, outlen))
            return 1;
    }
    return 0;
}

/* 1 if python can import module, run through the shell with its output
 * thrown away. */
static int importable(const char *python, const char *module) {
    char cmd[PATH_MAX + 128];

    if (snprintf(cmd, sizeof(cmd), "'%s' -c 'import %s' >/dev/null 2>&1",
                 python, module) >= (int)sizeof(cmd) ||
        strchr(python, '\'') != NULL)
        return 0;
    return system(cmd) == 0;
}

static void line(int yes, const char *name, const char *note) {
    printf("    [%c] %s%s%s\n", yes ? 'X' : ' ', name, note[0] ? " " : "",
           note);
}

/* 1 if the library a built-in transport loads at run time (MPI, verbs)
 * loads here; else 0 with why in note. */
static int loads(const char *transport, char *note, size_t len) {
    const char *why = NULL;

#ifdef HVD_WITH_MPI
    if (strcmp(transport, "mpi") == 0 && !hvd_mpi_lib_load(0))
        why = hvd_mpi_lib_why();
#endif
#ifdef HVD_WITH_VERBS
    if (strcmp(transport, "verbs") == 0 && !hvd_ibv_lib_load())
        why = hvd_ibv_lib_why();
#endif
    if (why != NULL)
        snprintf(note, len, "(built in, but %s)", why);
    return why == NULL;
}

int hvd_check_build(void) {
    static const struct {
        const char *name, *binding, *framework;
    } frameworks[] = {
        {"PyTorch", "hvd.torch", "torch"},
        {"TensorFlow", "hvd.tensorflow", "tensorflow"},
        {"Keras", "hvd.keras", "keras"},
    };
    static const char *const transports[] = {"tcp", "shm", "mpi", "verbs"};
    const char *python = getenv("HVD_PYTHON");
    char beside[PATH_MAX];
    int have_hvd;

    if (python != NULL && python[0] != '\0') {
        have_hvd = importable(python, "hvd");
    } else if (python_of_install(beside, sizeof(beside)) &&
               importable(beside, "hvd")) {
        python = beside;
        have_hvd = 1;
    } else {
        /* A python3 beside hvdrun that lacks the package is not the one
         * hvd was installed for (cmake --install into a prefix whose
         * bin/ has some other python3): PATH may know better. */
        python = "python3";
        have_hvd = importable(python, "hvd");
    }
    printf("hvd v%s:\n\nAvailable Frameworks (with %s):\n", HVD_VERSION_STRING,
           python);
    for (size_t i = 0; i < sizeof(frameworks) / sizeof(frameworks[0]); i++) {
        char note[160] = "";
        int yes = have_hvd && importable(python, frameworks[i].binding);

        if (!have_hvd)
            snprintf(note, sizeof(note), "(the hvd package is not importable)");
        else if (!yes && !importable(python, frameworks[i].framework))
            snprintf(note, sizeof(note), "(%s is not installed)",
                     frameworks[i].framework);
        else if (!yes)
            snprintf(note, sizeof(note), "(%s cannot be imported)",
                     frameworks[i].binding);
        line(yes, frameworks[i].name, note);
    }
    printf("\nAvailable Transports:\n");
    for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++) {
        char note[400] = "";
        int yes = hvd_built(transports[i]) &&
                  loads(transports[i], note, sizeof(note));
        line(yes, transports[i], note);
    }
    printf("\nAvailable GPU support:\n");
    line(hvd_built("cuda"), "CUDA", "");
    line(hvd_built("nccl"), "NCCL", "");
    return 0;
}
