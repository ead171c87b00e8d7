# Integration tests of the background engine, included by
# integration/CMakeLists.txt. One program (test_engine SUBTEST), each subtest run
# through run_engine_logs.sh, which sets the environment it needs and checks
# its logs.
add_executable(test_engine ${CMAKE_CURRENT_SOURCE_DIR}/test_engine.c)
target_link_libraries(test_engine PRIVATE hvd Threads::Threads m)
target_include_directories(test_engine PRIVATE
                           ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_engine PRIVATE ${HVD_WARNINGS})

foreach(subtest order threads fusion cache mismatch join stall stall_cached
        stall_shutdown timeline callback left)
  if(subtest MATCHES "^(stall|stall_cached|stall_shutdown|timeline)$")
    set(nps 2 3)
  else()
    set(nps 2 3 4)
  endif()
  foreach(np ${nps})
    set(test_name integration.engine.${subtest}.np${np})
    add_test(NAME ${test_name}
             COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/run_engine_logs.sh
                     $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_engine>
                     ${np} ${subtest})
    # 77: timeout(1) or python3 missing.
    set_tests_properties(${test_name} PROPERTIES
                         LABELS "integration;engine" TIMEOUT 180
                         SKIP_RETURN_CODE 77)
  endforeach()
endforeach()

# The engine's steps and their fast path (test_steps.c).
add_executable(test_steps ${CMAKE_CURRENT_SOURCE_DIR}/test_steps.c)
target_link_libraries(test_steps PRIVATE hvd Threads::Threads)
target_include_directories(test_steps PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_steps PRIVATE ${HVD_WARNINGS})
foreach(subtest dtypes mismatch join threads mixed inflight)
  foreach(np 1 2 3 4)
    if(np EQUAL 1 AND subtest MATCHES "^(mismatch|join|mixed|inflight)$")
      continue()
    endif()
    if(subtest STREQUAL "inflight" AND np GREATER 2)
      continue()
    endif()
    set(test_name integration.engine.steps.${subtest}.np${np})
    add_test(NAME ${test_name}
             COMMAND hvdrun -np ${np} -- $<TARGET_FILE:test_steps> ${subtest})
    set_tests_properties(${test_name} PROPERTIES
                         LABELS "integration;engine" TIMEOUT 180
                         SKIP_RETURN_CODE 77)
  endforeach()
endforeach()

# The steps' fast path for every kind of collective (test_steps_kinds.c),
# and a rank killed amid it (run_peer_lost.sh).
add_executable(test_steps_kinds ${CMAKE_CURRENT_SOURCE_DIR}/test_steps_kinds.c)
target_link_libraries(test_steps_kinds PRIVATE hvd Threads::Threads)
target_include_directories(test_steps_kinds PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_steps_kinds PRIVATE ${HVD_WARNINGS})
foreach(case "exact;1" "exact;2" "exact;3" "exact;4" "mismatch;2"
        "mismatch;3" "join;2" "join;3" "threads;2" "threads;3" "mixed;2"
        "mixed;3")
  list(GET case 0 subtest)
  list(GET case 1 np)
  set(test_name integration.engine.steps.kinds.${subtest}.np${np})
  add_test(NAME ${test_name}
           COMMAND hvdrun -np ${np} -- $<TARGET_FILE:test_steps_kinds>
                   ${subtest})
  set_tests_properties(${test_name} PROPERTIES
                       LABELS "integration;engine" TIMEOUT 180
                       SKIP_RETURN_CODE 77)
endforeach()
# The exact test again, at np 2 and 3: over TCP ("tcp"), whose steps carry
# larger parts of the kinds other than an allreduce (a network's exchanges
# cost more than the parts' copies); and with ranks that carry differently
# ("carry_by_rank": HVD_STEP_CARRY_BYTES per rank, rank 0 with room for an
# alltoall's counts alone, rank 1 for all, rank 2 for nothing), where an
# alltoall runs as its collective with the counts from the step where
# every rank carried them, and exchanged where one did not.
foreach(variant "tcp;HVD_TRANSPORT=tcp" "carry_by_rank;KINDS_CARRY_BY_RANK=64,,0")
  list(GET variant 0 suffix)
  list(GET variant 1 env)
  foreach(np 2 3)
    set(test_name integration.engine.steps.kinds.exact.${suffix}.np${np})
    add_test(NAME ${test_name}
             COMMAND hvdrun -np ${np} -- $<TARGET_FILE:test_steps_kinds> exact)
    set_tests_properties(${test_name} PROPERTIES
                         LABELS "integration;engine" TIMEOUT 180
                         ENVIRONMENT "${env}"
                         SKIP_RETURN_CODE 77)
  endforeach()
endforeach()
foreach(case "3;1;40" "2;0;31")
  list(GET case 0 np)
  list(GET case 1 victim)
  list(GET case 2 after)
  set(test_name integration.engine.steps.kinds.peer_lost.np${np}.victim${victim})
  add_test(NAME ${test_name}
           COMMAND sh ${HVD_SH}/run_peer_lost.sh
                   $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_steps_kinds>
                   ${np} ${victim} ${after})
  set_tests_properties(${test_name} PROPERTIES
                       LABELS "integration;engine;failure" TIMEOUT 120)
endforeach()

# Alltoall and reducescatter (test_scatter.c), through hvdrun at np 1-4 and
# under Open MPI's mpirun over TCP and over the MPI transport.
add_executable(test_scatter ${CMAKE_CURRENT_SOURCE_DIR}/test_scatter.c)
target_link_libraries(test_scatter PRIVATE hvd m)
target_include_directories(test_scatter PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_scatter PRIVATE ${HVD_WARNINGS})
foreach(subtest alltoall reducescatter adasum grouped)
  foreach(np 1 2 3 4)
    set(test_name integration.scatter.${subtest}.np${np})
    add_test(NAME ${test_name}
             COMMAND hvdrun -np ${np} -- $<TARGET_FILE:test_scatter> ${subtest})
    set_tests_properties(${test_name} PROPERTIES
                         LABELS "integration;engine" TIMEOUT 300)
  endforeach()
  if(HVD_WITH_MPI AND MPIEXEC_EXECUTABLE)
    foreach(case "2;tcp" "3;mpi")
      list(GET case 0 np)
      list(GET case 1 transport)
      set(test_name mpi.scatter.${subtest}.np${np}.${transport})
      add_test(NAME ${test_name}
               COMMAND ${HVD_MPIRUN} -np ${np} -x HVD_TRANSPORT=${transport}
                       $<TARGET_FILE:test_scatter> ${subtest})
      set_tests_properties(${test_name} PROPERTIES LABELS mpi TIMEOUT 300)
    endforeach()
  endif()
endforeach()

# Process sets (test_psets.c), through hvdrun at np 1-4 and under Open
# MPI's mpirun over TCP and over the MPI transport.
add_executable(test_psets ${CMAKE_CURRENT_SOURCE_DIR}/test_psets.c)
target_link_libraries(test_psets PRIVATE hvd)
target_include_directories(test_psets PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_psets PRIVATE ${HVD_WARNINGS})
foreach(subtest shapes concurrent errors)
  foreach(np 1 2 3 4)
    set(test_name integration.psets.${subtest}.np${np})
    add_test(NAME ${test_name}
             COMMAND hvdrun -np ${np} -- $<TARGET_FILE:test_psets> ${subtest})
    set_tests_properties(${test_name} PROPERTIES
                         LABELS "integration;engine" TIMEOUT 300)
  endforeach()
  if(HVD_WITH_MPI AND MPIEXEC_EXECUTABLE)
    foreach(case "2;tcp" "3;mpi")
      list(GET case 0 np)
      list(GET case 1 transport)
      set(test_name mpi.psets.${subtest}.np${np}.${transport})
      add_test(NAME ${test_name}
               COMMAND ${HVD_MPIRUN} -np ${np} -x HVD_TRANSPORT=${transport}
                       $<TARGET_FILE:test_psets> ${subtest})
      set_tests_properties(${test_name} PROPERTIES LABELS mpi TIMEOUT 300)
    endforeach()
  endif()
endforeach()
