#include "transport/base/dlib.h"

#include <dlfcn.h>
#include <stdio.h>

int hvd_dl_load(const char *file, int flags, int only_loaded,
                const hvd_dl_symbol *syms, size_t n, const char *hint,
                char *why, size_t len) {
    void *h = dlopen(file, flags | (only_loaded ? RTLD_NOLOAD : 0));
    size_t i = 0;

    if (h == NULL) {
        const char *err = dlerror();
        if (only_loaded)
            snprintf(why, len, "%s is not loaded in this process", file);
        else
            snprintf(why, len, "%s cannot be loaded (%s): %s", file,
                     err != NULL ? err : "dlopen failed", hint);
        return 0;
    }
    for (; i < n; i++) {
        /* A library loaded RTLD_GLOBAL: each symbol as the process's
         * linking sees it, as if libhvd were linked with the library. The
         * difference matters for objects: an executable that uses one
         * (MPI_COMM_WORLD is an object in Open MPI) has its own copy of it
         * (a copy relocation), which the library itself then uses too,
         * while dlsym(h) would give the library's original, unused one. */
        *syms[i].slot = (flags & RTLD_GLOBAL) != 0
                            ? dlsym(RTLD_DEFAULT, syms[i].name)
                            : NULL;
        if (*syms[i].slot == NULL)
            *syms[i].slot = dlsym(h, syms[i].name);
        if (*syms[i].slot == NULL)
            break;
    }
    if (i == n)
        return 1;
    snprintf(why, len, "%s has no %s: %s", file, syms[i].name, hint);
    for (size_t k = 0; k < n; k++)
        *syms[k].slot = NULL;
    dlclose(h);
    return 0;
}
