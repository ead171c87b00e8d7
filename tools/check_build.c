#include "tools/check_build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd/hvd.h"

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
    for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++)
        line(hvd_built(transports[i]), transports[i], "");
    printf("\nAvailable GPU support:\n");
    line(hvd_built("cuda"), "CUDA", "");
    line(hvd_built("nccl"), "NCCL", "");
    return 0;
}
