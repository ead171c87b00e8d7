# Reliability and security tests (docs/reliability.md), included by
# tests/CMakeLists.txt. Label `reliability`; `failure` too where a test kills
# or stops ranks (the ASan build then skips LeakSanitizer's exit-time scan,
# see tests/CMakeLists.txt). Scripts exit 77 (skipped) when what they need
# is missing (root, ip netns, sch_netem, timeout(1), python3).
set(HVD_REL_DIR ${CMAKE_CURRENT_SOURCE_DIR}/reliability)

foreach(name fault soak intruder)
  add_executable(test_${name} ${HVD_REL_DIR}/test_${name}.c)
  target_link_libraries(test_${name} PRIVATE hvd Threads::Threads m
                        ${CMAKE_DL_LIBS})
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
                     PROPERTIES LABELS "reliability;failure;transport"
                     TIMEOUT 900 SKIP_RETURN_CODE 77)

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

# Bad network between two network namespaces (run_badnet.sh): tc netem
# (where the kernel has no sch_netem, the same delay, jitter, loss and
# reordering by hvd_linkem, a link emulator in user space over TUN
# devices), random loss through nftables, and a link cut mid-run.
add_executable(hvd_linkem ${HVD_REL_DIR}/linkem.c)
target_compile_options(hvd_linkem PRIVATE ${HVD_WARNINGS})
foreach(mode netem loss linkcut)
  add_test(NAME reliability.badnet.${mode}
           COMMAND sh ${HVD_REL_DIR}/run_badnet.sh ${mode}
                   $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_soak>
                   $<TARGET_FILE:test_fault> $<TARGET_FILE:hvd_linkem>)
  set_tests_properties(reliability.badnet.${mode} PROPERTIES
                       LABELS "reliability" TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
set_property(TEST reliability.badnet.linkcut APPEND PROPERTY LABELS
             "failure;transport")

# Soak: 20,000 allreduces of random sizes (log-uniform, 0 B to 8 MiB),
# dtypes and ops at np 3, every result checked, resident memory after the
# warm-up growing by less than 1 MiB; and 4,000 mixed operations. The
# sanitizer builds run them with sizes up to 1 MiB and without the memory
# limit (ASan's quarantine holds freed memory on purpose).
if(HVD_ASAN OR HVD_TSAN)
  set(HVD_SOAK_ARGS --max-bytes 1M)
else()
  set(HVD_SOAK_ARGS --max-bytes 8M --rss-limit-kib 1024)
endif()
add_test(NAME reliability.soak.np3
         COMMAND hvdrun -np 3 -- $<TARGET_FILE:test_soak> --ops 20000
                 --kinds allreduce ${HVD_SOAK_ARGS})
add_test(NAME reliability.soak_mixed.np3
         COMMAND hvdrun -np 3 -- $<TARGET_FILE:test_soak> --ops 4000
                 --kinds mixed --seed 7 ${HVD_SOAK_ARGS})
set_tests_properties(reliability.soak.np3 reliability.soak_mixed.np3
                     PROPERTIES LABELS "reliability" TIMEOUT 900)

# Intruders (run_intruder.sh, intruder.py): strangers at the rendezvous and
# at a data port are refused or dropped and logged, the job's results do
# not change, and the job listens on the chosen interface only.
add_test(NAME reliability.intruder.np3
         COMMAND sh ${HVD_REL_DIR}/run_intruder.sh $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_intruder> ${HVD_REL_DIR}/intruder.py)
# TCP's ports are what is attacked: a one-host job under auto opens none.
set_tests_properties(reliability.intruder.np3 PROPERTIES
                     LABELS "reliability;transport" TIMEOUT 300
                     SKIP_RETURN_CODE 77
                     ENVIRONMENT "HVD_TRANSPORT=tcp")

# Neighbours (run_neighbours.sh): two jobs side by side, same user,
# overlapping ephemeral ports (a 64-port range in a namespace of their own,
# as root), busy ports and ports in TIME_WAIT.
add_test(NAME reliability.neighbours
         COMMAND sh ${HVD_REL_DIR}/run_neighbours.sh $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_soak>)
set_tests_properties(reliability.neighbours PROPERTIES
                     LABELS "reliability" TIMEOUT 300 SKIP_RETURN_CODE 77
                     ENVIRONMENT "HVD_TRANSPORT=tcp")
# The same with the default transport: two one-host jobs in shared memory
# (their segments must not meet either).
add_test(NAME reliability.neighbours.auto
         COMMAND sh ${HVD_REL_DIR}/run_neighbours.sh $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_soak>)
set_tests_properties(reliability.neighbours.auto PROPERTIES
                     LABELS "reliability" TIMEOUT 300 SKIP_RETURN_CODE 77
                     ENVIRONMENT "HVD_TRANSPORT=auto")

# The fuzz targets, each run over its corpus (tests/fuzz/fuzz_tests.cmake;
# an HVD_FUZZ build includes it from the top instead).
if(NOT HVD_FUZZ)
  include(${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_tests.cmake)
endif()

