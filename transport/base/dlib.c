#include "transport/base/dlib.h"

#include <dlfcn.h>
#include <stdio.h>

/*
 * The address of name in the library h was opened as (flags). A library
 * loaded RTLD_GLOBAL: the symbol as the process's linking sees it, as if
 * libhvd were linked with the library. The difference matters for
 * objects: an executable that uses one (MPI_COMM_WORLD is an object in
 * Open MPI) has its own copy of it (a copy relocation), which the library
 * itself then uses too, while dlsym(h) would give the library's original,
 * unused one.
 */
static void *find(void *h, int flags, const char *name) {
    void *p = (flags & RTLD_GLOBAL) != 0 ? dlsym(RTLD_DEFAULT, name) : NULL;

    return p != NULL ? p : dlsym(h, name);
}

int hvd_dl_load(const char *file, int flags, int only_loaded,
                const hvd_dl_symbol *syms, size_t n, const char *hint,
                char *why, size_t len) {
    void *h = dlopen(file, flags | (only_loaded ? RTLD_NOLOAD : 0));

    if (h == NULL) {
        const char *err = dlerror();
        if (only_loaded)
            snprintf(why, len, "%s is not loaded in this process", file);
        else
            snprintf(why, len, "%s cannot be loaded (%s): %s", file,
                     err != NULL ? err : "dlopen failed", hint);
        return 0;
    }
    /* Every symbol first, so that the slots are set only when all are
     * there. */
    for (size_t i = 0; i < n; i++) {
        if (find(h, flags, syms[i].name) == NULL) {
            snprintf(why, len, "%s has no %s: %s", file, syms[i].name, hint);
            dlclose(h);
            return 0;
        }
    }
    for (size_t i = 0; i < n; i++)
        *syms[i].slot = find(h, flags, syms[i].name);
    return 1;
}
