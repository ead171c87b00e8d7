# The TensorFlow op library (python/hvd/tensorflow/_ops/, its files listed in
# ops.h) that hvd.tensorflow loads: built when HVD_TF_PYTHON imports TensorFlow, against
# that TensorFlow's headers and library (tf.sysconfig). Included by the
# top-level CMakeLists.txt; sets HVD_WITH_TENSORFLOW and HVD_TF_NOTE.
#
# HVD_TF_PYTHON defaults to the suite's own virtual environment
# (.venv-tf, made by tools/install-tf) when there is one, else HVD_PYTHON.
# The probe runs Python with -I, so that under pip's isolated build the
# TensorFlow of the environment being installed into is the one found.
#
# The library leaves libhvd's symbols undefined: hvd.tensorflow loads the
# libhvd the hvd package uses with RTLD_GLOBAL first, so the ops and
# hvd.init() share one runtime whichever libhvd that is.
if(EXISTS ${CMAKE_SOURCE_DIR}/.venv-tf/bin/python)
  set(hvd_tf_python_default ${CMAKE_SOURCE_DIR}/.venv-tf/bin/python)
else()
  set(hvd_tf_python_default "${HVD_PYTHON}")
endif()
if(SKBUILD AND DEFINED Python_EXECUTABLE)
  set(hvd_tf_python_default "${Python_EXECUTABLE}")
endif()
set(HVD_TF_PYTHON "${hvd_tf_python_default}" CACHE FILEPATH
    "Python interpreter with TensorFlow, for the TensorFlow ops and tests")
# A build configured before .venv-tf existed (tools/run-demo, then
# tools/run-tests) cached HVD_PYTHON as the default: when that interpreter
# has no TensorFlow and the venv has appeared since, take the venv, so that
# the second command does not skip the TensorFlow tests.
if(NOT SKBUILD AND EXISTS ${CMAKE_SOURCE_DIR}/.venv-tf/bin/python AND
   HVD_TF_PYTHON STREQUAL "${HVD_PYTHON}")
  execute_process(COMMAND ${HVD_TF_PYTHON} -I -c "import tensorflow"
                  RESULT_VARIABLE hvd_tf_cached_rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT hvd_tf_cached_rc EQUAL 0)
    set_property(CACHE HVD_TF_PYTHON PROPERTY VALUE
                 ${CMAKE_SOURCE_DIR}/.venv-tf/bin/python)
  endif()
endif()
option(HVD_ENABLE_TENSORFLOW "Build the TensorFlow ops when TensorFlow is found" ON)

set(HVD_WITH_TENSORFLOW OFF)
set(HVD_TF_NOTE "disabled by HVD_ENABLE_TENSORFLOW=OFF")
if(HVD_ENABLE_TENSORFLOW AND (HVD_ASAN OR HVD_TSAN))
  set(HVD_TF_NOTE "not in sanitizer builds (TensorFlow is not instrumented)")
elseif(HVD_ENABLE_TENSORFLOW)
  set(hvd_tf_rc 1)
  if(HVD_TF_PYTHON)
    execute_process(
      COMMAND ${HVD_TF_PYTHON} -I -c
              "import tensorflow as tf; print(tf.sysconfig.get_include()); print(tf.sysconfig.get_lib()); print(tf.__version__)"
      OUTPUT_VARIABLE hvd_tf_out OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE hvd_tf_rc ERROR_QUIET)
  endif()
  if(hvd_tf_rc EQUAL 0)
    string(REPLACE "\n" ";" hvd_tf_out "${hvd_tf_out}")
    list(GET hvd_tf_out 0 HVD_TF_INCLUDE)
    list(GET hvd_tf_out 1 HVD_TF_LIBDIR)
    list(GET hvd_tf_out 2 HVD_TF_VERSION)
    find_library(HVD_TF_FRAMEWORK NAMES libtensorflow_framework.so.2
                 tensorflow_framework PATHS ${HVD_TF_LIBDIR} NO_DEFAULT_PATH)
  endif()
  if(HVD_TF_FRAMEWORK AND EXISTS ${HVD_TF_INCLUDE}/tensorflow/c/kernels.h)
    set(HVD_WITH_TENSORFLOW ON)
    set(HVD_TF_NOTE "TensorFlow ${HVD_TF_VERSION} of ${HVD_TF_PYTHON}")
    # The op library: TensorFlow's C API, and C++ only to keep a kernel's
    # completion (keep_done.cc: std::function, nothing of TensorFlow's), so
    # that it loads in any TensorFlow 2.x with that C API. Waiting for a GPU
    # kernel's stream needs TensorFlow's C++ classes (device_sync.cc, with
    # TensorFlow's own compile flags), which tie a library to the
    # TensorFlow it was built against: it is a library of its own,
    # libhvd_tensorflow_gpu.so beside the op library, which loads it at
    # the first GPU kernel (docs/tensorflow.md).
    enable_language(CXX)
    add_library(hvd_tensorflow SHARED
                ${CMAKE_CURRENT_LIST_DIR}/register.c
                ${CMAKE_CURRENT_LIST_DIR}/reduce.c
                ${CMAKE_CURRENT_LIST_DIR}/allgather.c
                ${CMAKE_CURRENT_LIST_DIR}/alltoall.c
                ${CMAKE_CURRENT_LIST_DIR}/twostep.c
                ${CMAKE_CURRENT_LIST_DIR}/glue.c
                ${CMAKE_CURRENT_LIST_DIR}/keep_done.cc)
    add_library(hvd_tensorflow_gpu SHARED
                ${CMAKE_CURRENT_LIST_DIR}/device_sync.cc)
    target_compile_options(hvd_tensorflow_gpu PRIVATE -std=c++17
      -D_GLIBCXX_USE_CXX11_ABI=1 -DEIGEN_MAX_ALIGN_BYTES=64)
    foreach(t hvd_tensorflow hvd_tensorflow_gpu)
      target_include_directories(${t} SYSTEM PRIVATE ${HVD_TF_INCLUDE})
      target_include_directories(${t} PRIVATE ${HVD_PUBLIC_INCLUDE_DIRS}
                                 ${CMAKE_SOURCE_DIR})
      target_link_libraries(${t} PRIVATE ${HVD_TF_FRAMEWORK} Threads::Threads)
      set_target_properties(${t} PROPERTIES
                            LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
                            BUILD_RPATH "${HVD_TF_LIBDIR}"
                            INSTALL_RPATH "${HVD_TF_LIBDIR}")
    endforeach()
    target_link_libraries(hvd_tensorflow PRIVATE ${CMAKE_DL_LIBS})
    target_compile_options(hvd_tensorflow PRIVATE
                           $<$<COMPILE_LANGUAGE:C>:${HVD_WARNINGS}>)
    # cmake --install: beside libhvd, where hvd.tensorflow also looks.
    if(NOT SKBUILD)
      install(TARGETS hvd_tensorflow hvd_tensorflow_gpu
              LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
    endif()
  else()
    set(HVD_TF_NOTE "TensorFlow not importable by ${HVD_TF_PYTHON}: tools/install-tf makes .venv-tf with it, or pip install tensorflow-cpu and reconfigure (-DHVD_TF_PYTHON=...)")
  endif()
endif()
