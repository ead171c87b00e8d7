/*
 * A main() for the fuzz targets where libFuzzer is not used: runs
 * LLVMFuzzerTestOneInput once on every file named on the command line (a
 * directory: on every file in it). The regular build runs each target
 * over its corpus this way (ctest fuzz.<target>.corpus), so that the
 * targets build with gcc and the corpus passes under ASan+UBSan there too;
 * tests/fuzz/run-fuzzers runs the real fuzzer.
 */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long len;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 ||
        fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "cannot read %s\n", path);
        if (f != NULL)
            fclose(f);
        return -1;
    }
    buf = malloc(len > 0 ? (size_t)len : 1);
    if (buf == NULL || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "cannot read %s\n", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int n = 0, bad = 0;

    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            struct dirent *e;
            while (d != NULL && (e = readdir(d)) != NULL) {
                char path[4096];
                if (e->d_name[0] == '.')
                    continue;
                snprintf(path, sizeof(path), "%s/%s", argv[i], e->d_name);
                bad |= run_file(path) != 0;
                n++;
            }
            if (d != NULL)
                closedir(d);
        } else {
            bad |= run_file(argv[i]) != 0;
            n++;
        }
    }
    printf("%d inputs run\n", n);
    return bad || n == 0;
}
