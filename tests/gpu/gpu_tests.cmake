# Tests of gpu/, included by tests/CMakeLists.txt.
#
# Label unit: the staging pipeline's scheduling (a simulated stream and
# network, no GPU needed), run everywhere.
add_executable(test_stage ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_stage.c)
target_link_libraries(test_stage PRIVATE hvd_internal PkgConfig::CMOCKA m)
target_compile_options(test_stage PRIVATE ${HVD_WARNINGS})
add_test(NAME unit.stage COMMAND test_stage)
set_tests_properties(unit.stage PROPERTIES LABELS unit TIMEOUT 300)

# Label integration: device memory where no GPU can be used (run here and
# everywhere). BUILD tells the programs what hvd was built with.
if(HVD_WITH_NCCL)
  set(HVD_GPU_BUILD nccl)
elseif(HVD_WITH_CUDA)
  set(HVD_GPU_BUILD cuda)
else()
  set(HVD_GPU_BUILD nocuda)
endif()
add_executable(test_gpu_nodev ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_gpu_nodev.c)
target_link_libraries(test_gpu_nodev PRIVATE hvd ${CMAKE_DL_LIBS})
target_include_directories(test_gpu_nodev PRIVATE
                           ${CMAKE_CURRENT_SOURCE_DIR}/integration)
target_compile_options(test_gpu_nodev PRIVATE ${HVD_WARNINGS})
# A stand-in CUDA driver (two fake devices) the fake-driver runs load
# first through LD_LIBRARY_PATH.
add_library(hvd_fake_cuda SHARED ${CMAKE_CURRENT_SOURCE_DIR}/gpu/fake_libcuda.c)
set_target_properties(hvd_fake_cuda PROPERTIES OUTPUT_NAME cuda SUFFIX .so.1
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fakecuda)
target_compile_options(hvd_fake_cuda PRIVATE ${HVD_WARNINGS})
foreach(case "nogpu;1" "nogpu;2" "fake;1" "fake;2" "nccl;2")
  list(GET case 0 mode)
  list(GET case 1 np)
  set(name gpu_nodev.${mode}.np${np})
  add_test(NAME ${name}
           COMMAND hvdrun -np ${np} -- $<TARGET_FILE:test_gpu_nodev> ${mode}
                   ${HVD_GPU_BUILD})
  set_tests_properties(${name} PROPERTIES LABELS integration TIMEOUT 120
                       SKIP_RETURN_CODE 77)
  if(NOT mode STREQUAL "nogpu")
    set_tests_properties(${name} PROPERTIES ENVIRONMENT
      "LD_LIBRARY_PATH=${CMAKE_CURRENT_BINARY_DIR}/fakecuda"
      DEPENDS hvd_fake_cuda)
  endif()
endforeach()

# Label integration: the whole device path of the engine on a simulated
# GPU (tests/gpu/sim_gpu.c as the GPU backend of a libhvd of its own, the
# stand-in driver saying which memory is "device" memory): negotiation,
# separate fusion, the executor's fences, the staging pipeline over TCP
# with the collectives' device memory operations. No GPU needed.
add_library(hvd_simgpu SHARED $<TARGET_OBJECTS:hvd_objs>
            ${CMAKE_CURRENT_SOURCE_DIR}/gpu/sim_gpu.c)
target_include_directories(hvd_simgpu PRIVATE ${CMAKE_SOURCE_DIR}
                           ${CMAKE_SOURCE_DIR}/api/include)
target_link_libraries(hvd_simgpu PRIVATE PkgConfig::PROTOBUF_C
                      OpenSSL::Crypto Threads::Threads ${CMAKE_DL_LIBS})
if(HVD_WITH_MPI)
  target_link_libraries(hvd_simgpu PRIVATE MPI::MPI_C)
endif()
if(HVD_WITH_VERBS)
  target_link_libraries(hvd_simgpu PRIVATE ${IBVERBS_LIBRARY})
endif()
target_compile_options(hvd_simgpu PRIVATE ${HVD_WARNINGS})
add_executable(test_gpu_sim ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_gpu.c
               ${CMAKE_CURRENT_SOURCE_DIR}/gpu/sim_cudart.c)
target_compile_definitions(test_gpu_sim PRIVATE HVD_TEST_SIM)
target_include_directories(test_gpu_sim PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/integration ${CMAKE_CURRENT_SOURCE_DIR}/gpu
  ${CMAKE_SOURCE_DIR}/api/include)
target_link_libraries(test_gpu_sim PRIVATE hvd_simgpu m ${CMAKE_DL_LIBS})
target_compile_options(test_gpu_sim PRIVATE ${HVD_WARNINGS})
foreach(case "1|local||" "2|staged over tcp||"
        "3|staged over tcp||HVD_GPU_STAGE_BYTES=4K;HVD_GPU_STAGE_DEPTH=2;HVD_CHUNK_BYTES=64K"
        "4|staged over tcp|--quick|"
        "3|direct over tcp||HVD_TEST_GPU_DIRECT=1")
  string(REPLACE "|" ";" fields "${case}")
  list(GET fields 0 np)
  list(GET fields 1 path)
  list(GET fields 2 extra)
  list(GET fields 3 env)
  set(name gpu_sim.collectives.np${np})
  if(env MATCHES "DIRECT")
    set(name ${name}.direct)
  elseif(env)
    set(name ${name}.smallpieces)
  endif()
  add_test(NAME ${name}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/gpu/run_gpu.sh
                   $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_gpu_sim> ${np}
                   tcp "${path}" --max-count 65537 ${extra})
  set_tests_properties(${name} PROPERTIES LABELS integration TIMEOUT 600
    ENVIRONMENT "LD_LIBRARY_PATH=${CMAKE_CURRENT_BINARY_DIR}/fakecuda;${env}")
endforeach()

# The simulated GPU staged over the shared-memory transport.
add_test(NAME gpu_sim.collectives.np2.shm
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/gpu/run_gpu.sh
                 $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_gpu_sim> 2
                 shm "staged over shm" --max-count 65537)
set_tests_properties(gpu_sim.collectives.np2.shm PROPERTIES LABELS integration
  TIMEOUT 600
  ENVIRONMENT "LD_LIBRARY_PATH=${CMAKE_CURRENT_BINARY_DIR}/fakecuda")

# Label gpu: device buffers of every dtype through each path, np 1 and 2
# (and 3) on whatever GPUs the machine has; SKIP (77) without one.
# tools/gpu-check runs them. Each case: np, HVD_TRANSPORT, the path the log
# must show (a regular expression), extra arguments.
if(HVD_WITH_CUDA)
  add_executable(test_gpu ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_gpu.c)
  target_link_libraries(test_gpu PRIVATE hvd CUDA::cudart m)
  target_include_directories(test_gpu PRIVATE
                             ${CMAKE_CURRENT_SOURCE_DIR}/integration)
  target_compile_options(test_gpu PRIVATE ${HVD_WARNINGS})
  foreach(case "1|auto|local|" "1|nccl|nccl|" "2|nccl|nccl|--gpu-per-rank"
          "2|tcp|staged over tcp|" "2|shm|staged over shm|"
          "2|auto|nccl,staged over shm|" "3|tcp|staged over tcp|--quick")
    string(REPLACE "|" ";" fields "${case}")
    list(GET fields 0 np)
    list(GET fields 1 transport)
    list(GET fields 2 path)
    list(GET fields 3 extra)
    set(name gpu.collectives.np${np}.${transport})
    add_test(NAME ${name}
             COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/gpu/run_gpu.sh
                     $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_gpu> ${np}
                     ${transport} "${path}" ${extra})
    set_tests_properties(${name} PROPERTIES LABELS gpu TIMEOUT 600
                         SKIP_RETURN_CODE 77)
  endforeach()

  # The CUDA kernels bit for bit against the CPU kernels (links the static
  # library for the internal kernel entry points).
  add_executable(test_kernels ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_kernels.c)
  target_link_libraries(test_kernels PRIVATE hvd_internal m)
  target_compile_options(test_kernels PRIVATE ${HVD_WARNINGS})
  add_test(NAME gpu.kernels COMMAND test_kernels)
  set_tests_properties(gpu.kernels PROPERTIES LABELS gpu TIMEOUT 300
                       SKIP_RETURN_CODE 77)
  # The kernels' element code on the CPU, everywhere CUDA is built.
  add_test(NAME unit.kernels_host COMMAND test_kernels --emulated)
  set_tests_properties(unit.kernels_host PROPERTIES LABELS unit TIMEOUT 300)
endif()
