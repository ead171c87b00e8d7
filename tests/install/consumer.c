/* The smallest trainer: init, one allreduce, shutdown. */
#include <stdio.h>

#include <hvd/hvd.h>

int main(void) {
    float grad[4] = {1, 2, 3, 4};

    if (hvd_init() != HVD_OK) {
        fprintf(stderr, "hvd_init: %s\n", hvd_last_error());
        return 1;
    }
    hvd_status st =
        hvd_allreduce("grad", grad, grad, 4, HVD_FLOAT32, HVD_AVERAGE);
    if (st != HVD_OK) {
        fprintf(stderr, "%s: %s\n", hvd_strerror(st), hvd_last_error());
        return 1;
    }
    printf("rank %d of %d: %g %g %g %g\n", hvd_rank(), hvd_size(), grad[0],
           grad[1], grad[2], grad[3]);
    hvd_shutdown();
    return grad[3] == 4.0f ? 0 : 1;
}
