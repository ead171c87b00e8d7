/*
 * hvdrun --check-build: what this install of hvd has, as horovodrun
 * --check-build prints it.
 */
#ifndef HVD_TOOLS_CHECK_BUILD_H
#define HVD_TOOLS_CHECK_BUILD_H

/* Prints the frameworks (hvd.torch, hvd.tensorflow, hvd.keras importable
 * by the Python of HVD_PYTHON, else the python3 of the environment hvdrun
 * is installed in (beside it in bin/) when that imports hvd, else python3
 * on PATH), the transports and the GPU support libhvd was built with, to
 * stdout. Returns 0. */
int hvd_check_build(void);

#endif
