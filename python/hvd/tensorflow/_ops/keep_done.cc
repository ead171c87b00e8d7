// Keeping a TensorFlow asynchronous kernel's completion for later: the one
// thing TensorFlow's C API cannot do (see docs/tensorflow.md).
//
// TF_NewAsyncKernelBuilder's compute function receives done, a
// TF_AsyncOpKernelDoneCallback*, which TensorFlow makes by taking the
// address of its own by-value AsyncOpKernel::DoneCallback parameter
// (tensorflow/c/kernels.cc, CAsyncOpKernel::ComputeAsync): that object dies
// when the compute function returns, so calling
// TF_RunAsyncOpKernelDoneCallback(done) later, when libhvd has finished,
// would call a destroyed std::function. The callback is a
// std::function<void()> (TF_RunAsyncOpKernelDoneCallback calls it as one),
// so it is copied here while it is alive, and the copy is called and freed
// when the operation ends.
#include <functional>
#include <new>

extern "C" {

// A heap copy of the callback done points at, or nullptr out of memory.
void *hvd_tf_keep_done(void *done) {
    return new (std::nothrow)
        std::function<void()>(*static_cast<std::function<void()> *>(done));
}

// Runs and frees a copy made by hvd_tf_keep_done.
void hvd_tf_run_done(void *kept) {
    auto *fn = static_cast<std::function<void()> *>(kept);
    (*fn)();
    delete fn;
}
}
