#!/bin/sh
# Runs its arguments where an NVIDIA GPU is (its device node exists), else
# reports SKIP (77) at once: the framework tests on a real GPU would spend
# seconds importing torch or TensorFlow only to find none.
#
#   needs_gpu.sh COMMAND [ARGS...]
if [ ! -e /dev/nvidiactl ] && [ ! -e /dev/nvidia0 ]; then
    echo "SKIP: no NVIDIA GPU on this machine (no /dev/nvidia0)"
    exit 77
fi
exec "$@"
