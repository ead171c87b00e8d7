# Tests of the Python package (python/hvd, hvd.torch), included by
# tests/CMakeLists.txt. Each pytest file runs in one hvdrun launch per rank
# count (importing torch costs seconds; one launch runs a whole file). They
# skip (77) when HVD_PYTHON (cmake/python.cmake) lacks pytest, numpy or
# torch.
set(HVD_PY_TESTS ${CMAKE_CURRENT_LIST_DIR})
# The parts this build has, which hvd.mpi_built() and friends must report.
set(hvd_py_built tcp shm)
foreach(part MPI VERBS CUDA NCCL)
  if(HVD_WITH_${part})
    string(TOLOWER ${part} p)
    list(APPEND hvd_py_built ${p})
  endif()
endforeach()
string(REPLACE ";" "," hvd_py_built "${hvd_py_built}")
foreach(case "numpy;1;numpy,pytest" "numpy;2;numpy,pytest"
        "torch;1;torch,numpy,pytest" "torch;2;torch,numpy,pytest")
  list(GET case 0 file)
  list(GET case 1 np)
  list(GET case 2 modules)
  add_test(NAME python.${file}.np${np}
           COMMAND sh ${HVD_PY_TESTS}/run_python.sh $<TARGET_FILE:hvdrun>
                   "${HVD_PYTHON}" $<TARGET_FILE:hvd> ${np} ${modules}
                   -m pytest -q -x -p no:cacheprovider
                   ${HVD_PY_TESTS}/test_${file}.py)
  set_tests_properties(python.${file}.np${np} PROPERTIES
                       LABELS python TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "HVD_TEST_BUILT=${hvd_py_built}")
endforeach()

# hvd.torch on libhvd's device path, with the simulated GPU of the C tests
# (tests/gpu/gpu_tests.cmake builds libhvd_simgpu and the stand-in driver).
foreach(np 1 2)
  add_test(NAME python.torch_simgpu.np${np}
           COMMAND sh ${HVD_PY_TESTS}/run_python.sh $<TARGET_FILE:hvdrun>
                   "${HVD_PYTHON}" $<TARGET_FILE:hvd_simgpu> ${np}
                   torch,numpy,pytest -m pytest -q -x -p no:cacheprovider
                   ${HVD_PY_TESTS}/test_torch_simgpu.py)
  set_tests_properties(python.torch_simgpu.np${np} PROPERTIES
    LABELS python TIMEOUT 300 SKIP_RETURN_CODE 77
    ENVIRONMENT
    "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/tests/fakecuda;HVD_LOG_LEVEL=info")
endforeach()

# hvd.torch with CUDA tensors on a real GPU (label gpu; SKIP, 77, where
# torch sees no GPU or hvd was built without CUDA).
add_test(NAME gpu.torch.np1
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/gpu/needs_gpu.sh
                 sh ${HVD_PY_TESTS}/run_python.sh $<TARGET_FILE:hvdrun>
                 "${HVD_PYTHON}" $<TARGET_FILE:hvd> 1 torch,numpy,pytest
                 ${HVD_PY_TESTS}/test_torch_cuda.py)
add_test(NAME gpu.torch.np2
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/gpu/needs_gpu.sh
                 sh ${HVD_PY_TESTS}/run_python.sh $<TARGET_FILE:hvdrun>
                 "${HVD_PYTHON}" $<TARGET_FILE:hvd> 2 torch,numpy,pytest
                 ${HVD_PY_TESTS}/test_torch_cuda.py)
set_tests_properties(gpu.torch.np1 gpu.torch.np2 PROPERTIES
                     LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)

# The example trainer, briefly, on 2 ranks.
add_test(NAME python.example.pytorch_synthetic.np2
         COMMAND sh ${HVD_PY_TESTS}/run_python.sh $<TARGET_FILE:hvdrun>
                 "${HVD_PYTHON}" $<TARGET_FILE:hvd> 2 torch
                 ${CMAKE_SOURCE_DIR}/examples/pytorch_synthetic.py
                 --batch-size 8 --num-warmup-batches 1
                 --num-batches-per-iter 2 --num-iters 2)
set_tests_properties(python.example.pytorch_synthetic.np2 PROPERTIES
                     LABELS python TIMEOUT 300 SKIP_RETURN_CODE 77)

# cmake --install puts the package where the installed libhvd is found.
add_test(NAME python.install
         COMMAND sh ${HVD_PY_TESTS}/run_install.sh ${CMAKE_BINARY_DIR}
                 "${HVD_PYTHON}" "${HVD_PYTHON_INSTALL_DIR}")
set_tests_properties(python.install PROPERTIES
                     LABELS "python;install" TIMEOUT 300 SKIP_RETURN_CODE 77)

# hvdrun --check-build tells the truth about this build.
add_test(NAME python.check_build
         COMMAND sh ${HVD_PY_TESTS}/run_check_build.sh $<TARGET_FILE:hvdrun>
                 "${HVD_PYTHON}" $<TARGET_FILE:hvd> "${hvd_py_built}")
set_tests_properties(python.check_build PROPERTIES LABELS python TIMEOUT 120)
