# Reliability and security tests (docs/reliability.md), included by
# tests/CMakeLists.txt. Label `reliability`; `failure` too where a test kills
# or stops ranks (the ASan build then skips LeakSanitizer's exit-time scan,
# see tests/CMakeLists.txt). Scripts exit 77 (skipped) when what they need
# is missing (root, ip netns, sch_netem, timeout(1), python3).
set(HVD_REL_DIR ${CMAKE_CURRENT_SOURCE_DIR}/reliability)

foreach(name fault)
  add_executable(test_${name} ${HVD_REL_DIR}/test_${name}.c)
  target_link_libraries(test_${name} PRIVATE hvd Threads::Threads m)
  target_include_directories(test_${name} PRIVATE
                             ${CMAKE_CURRENT_SOURCE_DIR}/integration)
  target_compile_options(test_${name} PRIVATE ${HVD_WARNINGS})
endforeach()

# Dead rank: SIGKILL of a random rank at a random moment, 20 times.
add_test(NAME reliability.dead_rank.np4
         COMMAND sh ${HVD_REL_DIR}/run_fault.sh kill $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_fault> 4 20)
# Stopped rank: SIGSTOP with HVD_TIMEOUT_SECONDS=5.
add_test(NAME reliability.stopped_rank.np4
         COMMAND sh ${HVD_REL_DIR}/run_fault.sh stop $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_fault> 4 3)
set_tests_properties(reliability.dead_rank.np4 reliability.stopped_rank.np4
                     PROPERTIES LABELS "reliability;failure" TIMEOUT 900
                     SKIP_RETURN_CODE 77)

if(HVD_WITH_MPI AND MPIEXEC_EXECUTABLE)
  # The same under Open MPI's mpirun (kept on loopback), HVD_TRANSPORT=tcp.
  string(REPLACE ";" " " HVD_REL_MPIRUN
         "${MPIEXEC_EXECUTABLE};--allow-run-as-root;--oversubscribe;--mca;btl;self,tcp;--mca;btl_tcp_if_include;lo;--mca;oob_tcp_if_include;lo")
  add_test(NAME reliability.dead_rank.mpirun.np4
           COMMAND sh ${HVD_REL_DIR}/run_fault.sh kill "${HVD_REL_MPIRUN}"
                   $<TARGET_FILE:test_fault> 4 20)
  set_tests_properties(reliability.dead_rank.mpirun.np4 PROPERTIES
                       LABELS "reliability;failure;mpi" TIMEOUT 900
                       SKIP_RETURN_CODE 77)
endif()
