// Waiting for the GPU work TensorFlow queued for a kernel's inputs: the
// second thing TensorFlow's C API cannot do for us (see docs/tensorflow.md).
//
// On a GPU, TensorFlow runs a kernel once its inputs' producers are queued
// on the device's compute stream, not once they have run; a kernel that
// hands the inputs' memory to something outside TensorFlow (libhvd, with
// its own stream) must wait for that stream first. The C API gives a
// kernel its stream only on pluggable devices (TF_GetStream), not on
// TensorFlow's own CUDA device, so this reaches the stream through the C++
// OpKernelContext the C API's TF_OpKernelContext is (tensorflow/c/
// kernels.cc casts one to the other) and blocks until it is done.
#include <cstddef>
#include <cstdio>
#include <string>

#include "tensorflow/c/kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "xla/stream_executor/stream.h"

extern "C" {

// 0 once the work queued on the kernel's device stream has finished (at
// once where there is none: a CPU kernel); else -1 with why.
int hvd_tf_sync_device(TF_OpKernelContext *ctx, char *why, size_t whylen) {
    auto *c = reinterpret_cast<tensorflow::OpKernelContext *>(ctx);
    tensorflow::DeviceContext *dc = c->op_device_context();
    stream_executor::Stream *stream = dc != nullptr ? dc->stream() : nullptr;

    if (stream == nullptr)
        return 0;
    absl::Status st = stream->BlockHostUntilDone();
    if (st.ok())
        return 0;
    std::snprintf(why, whylen, "waiting for TensorFlow's GPU stream: %s",
                  std::string(st.message()).c_str());
    return -1;
}
}
