#include "tools/check_build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/hvd.h"
#ifdef HVD_WITH_MPI
#include "transport/mpi/mpi.h"
#endif
#ifdef HVD_WITH_VERBS
#include "transport/verbs/lib.h"
#endif

/* 1 if python can import module, run through the shell with its output
 * thrown away. */
static int importable(const char *python, const char *module) {
    char cmd[512];

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
    int have_hvd;

    if (python == NULL || python[0] == '\0')
        python = "python3";
    have_hvd = importable(python, "hvd");
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
