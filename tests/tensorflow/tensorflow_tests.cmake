# Tests of hvd.tensorflow and hvd.tensorflow.keras (label tensorflow),
# included by tests/CMakeLists.txt after python/python_tests.cmake. They
# run with HVD_TF_PYTHON (python/tensorflow/tensorflow.cmake: the suite's
# .venv-tf, made by tools/install-tf) and the op library of this build.
# Without the op library each reports SKIP (77) with the reason.
set(HVD_TF_TESTS ${CMAKE_CURRENT_LIST_DIR})
set(hvd_tf_cases
    "tensorflow.np1|1|-m,pytest,-q,-x,-p,no:cacheprovider,${HVD_TF_TESTS}/test_tensorflow.py"
    "tensorflow.np2|2|-m,pytest,-q,-x,-p,no:cacheprovider,${HVD_TF_TESTS}/test_tensorflow.py"
    "keras.np1|1|-m,pytest,-q,-x,-p,no:cacheprovider,${HVD_TF_TESTS}/test_keras.py"
    "keras.np2|2|-m,pytest,-q,-x,-p,no:cacheprovider,${HVD_TF_TESTS}/test_keras.py"
    "gpu.np1|1|${HVD_TF_TESTS}/test_tensorflow_gpu.py"
    "gpu.np2|2|${HVD_TF_TESTS}/test_tensorflow_gpu.py"
    "example.tensorflow_seed.np2|2|${CMAKE_SOURCE_DIR}/examples/tensorflow_seed.py,--steps,40"
    "example.tensorflow2_synthetic.np2|2|${CMAKE_SOURCE_DIR}/examples/tensorflow2_synthetic.py,--batch-size,8,--num-warmup-batches,1,--num-batches-per-iter,2,--num-iters,2"
    "example.keras_synthetic.np2|2|${CMAKE_SOURCE_DIR}/examples/keras_synthetic.py,--batch-size,8,--num-batches,4,--epochs,1")
foreach(case ${hvd_tf_cases})
  # name|np|arguments, the arguments separated by commas.
  string(REPLACE "|" ";" case "${case}")
  list(GET case 0 name)
  list(GET case 1 np)
  list(GET case 2 args)
  string(REPLACE "," ";" args "${args}")
  set(test_name tensorflow.${name})
  set(gate)
  if(name MATCHES "^gpu")
    set(gate sh ${CMAKE_SOURCE_DIR}/tests/gpu/needs_gpu.sh)
  endif()
  if(HVD_WITH_TENSORFLOW)
    add_test(NAME ${test_name}
             COMMAND ${gate} sh ${HVD_TF_TESTS}/run_tf.sh $<TARGET_FILE:hvdrun>
                     "${HVD_TF_PYTHON}" $<TARGET_FILE:hvd>
                     $<TARGET_FILE:hvd_tensorflow> ${np} ${args})
  else()
    add_test(NAME ${test_name}
             COMMAND sh -c "echo 'SKIP: no TensorFlow ops in this build: ${HVD_TF_NOTE}'; exit 77")
  endif()
  set_tests_properties(${test_name} PROPERTIES
                       LABELS "tensorflow;python" TIMEOUT 300
                       SKIP_RETURN_CODE 77)
  if(name MATCHES "^gpu")
    # On a real GPU only (SKIP, 77, elsewhere), like the C ones.
    set_tests_properties(${test_name} PROPERTIES LABELS "tensorflow;gpu")
  endif()
endforeach()

# The examples under Open MPI's mpirun too (hvd bootstraps through MPI).
if(HVD_WITH_TENSORFLOW AND HVD_MPIRUN)
  string(REPLACE ";" " " hvd_tf_mpirun "${HVD_MPIRUN}")
  foreach(case
      "tensorflow_seed|--steps,40"
      "tensorflow2_synthetic|--batch-size,8,--num-warmup-batches,1,--num-batches-per-iter,2,--num-iters,2"
      "keras_synthetic|--batch-size,8,--num-batches,4,--epochs,1")
    string(REPLACE "|" ";" case "${case}")
    list(GET case 0 example)
    list(GET case 1 args)
    string(REPLACE "," ";" args "${args}")
    set(test_name tensorflow.example.${example}.mpirun.np2)
    add_test(NAME ${test_name}
             COMMAND sh ${HVD_TF_TESTS}/run_tf.sh --mpirun "${hvd_tf_mpirun}"
                     "${HVD_TF_PYTHON}" $<TARGET_FILE:hvd>
                     $<TARGET_FILE:hvd_tensorflow> 2
                     ${CMAKE_SOURCE_DIR}/examples/${example}.py ${args})
    set_tests_properties(${test_name} PROPERTIES
                         LABELS "tensorflow;python;mpi" TIMEOUT 300
                         SKIP_RETURN_CODE 77)
  endforeach()
endif()

# A rank dies: the other's collective raises a TF error with the sentence.
foreach(mode eager function)
  set(test_name tensorflow.kill_rank.${mode}.np2)
  if(HVD_WITH_TENSORFLOW)
    add_test(NAME ${test_name}
             COMMAND sh ${HVD_TF_TESTS}/run_kill.sh $<TARGET_FILE:hvdrun>
                     "${HVD_TF_PYTHON}" $<TARGET_FILE:hvd>
                     $<TARGET_FILE:hvd_tensorflow> ${mode})
  else()
    add_test(NAME ${test_name}
             COMMAND sh -c "echo 'SKIP: no TensorFlow ops in this build: ${HVD_TF_NOTE}'; exit 77")
  endif()
  set_tests_properties(${test_name} PROPERTIES
                       LABELS "tensorflow;python;failure" TIMEOUT 120
                       SKIP_RETURN_CODE 77)
endforeach()
