# Every path of the selector, forced, at np 2, 3 and 4: each algorithm over
# each transport that can run it, with exact results for every dtype and op
# (test_collectives). Included by integration/CMakeLists.txt after the
# integration tests are defined. The MPI transport's paths are in the mpi
# section (they need mpirun).
set(HVD_PATHS_COUNT 65536)
foreach(transport tcp shm)
  foreach(algo ring rd rabenseifner direct)
    if(algo STREQUAL "direct" AND NOT transport STREQUAL "shm")
      continue()
    endif()
    if(algo STREQUAL "ring")
      set(bcast pipeline)
    elseif(algo STREQUAL "direct")
      set(bcast direct)
    else()
      set(bcast tree)
    endif()
    foreach(np 2 3 4)
      set(name integration.paths.${transport}.${algo}.np${np})
      add_test(NAME ${name}
               COMMAND hvdrun -np ${np} -- $<TARGET_FILE:test_collectives>
                       --max-count ${HVD_PATHS_COUNT})
      set(labels integration paths)
      if(transport STREQUAL "shm" AND np EQUAL 3)
        list(APPEND labels transport)
      endif()
      set_tests_properties(${name} PROPERTIES LABELS "${labels}"
        TIMEOUT 300
        ENVIRONMENT "HVD_TRANSPORT=${transport};HVD_ALGORITHM=${algo};HVD_BCAST_ALGORITHM=${bcast}")
    endforeach()
  endforeach()
endforeach()

# Hierarchical allreduce on one machine: HVD_HOSTNAME makes ranks 0-1 one
# "host" and the others another, so shared memory serves each pair and TCP
# joins them; with one-sided reads (direct phases) and without (ring
# phases), and as auto's choice.
foreach(case "4;hier;1" "6;hier;1" "4;hier;0" "4;auto;1")
  list(GET case 0 np)
  list(GET case 1 algo)
  list(GET case 2 cma)
  set(name integration.paths.hier.${algo}.np${np}.cma${cma})
  add_test(NAME ${name}
           COMMAND hvdrun -np ${np} -- sh -c
                   "HVD_HOSTNAME=host$((HVD_RANK * 2 / ${np})) exec \"$0\" \"$@\""
                   $<TARGET_FILE:test_collectives>
                   --max-count ${HVD_PATHS_COUNT})
  set_tests_properties(${name} PROPERTIES LABELS "integration;paths"
    TIMEOUT 300 ENVIRONMENT "HVD_ALGORITHM=${algo};HVD_SHM_CMA=${cma}")
endforeach()

# Failures over shared memory: a killed rank, a mismatch.
add_test(NAME integration.peer_lost.shm.np3.victim1
         COMMAND sh ${HVD_SH}/run_peer_lost.sh $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_peer_lost> 3 1 40)
add_test(NAME integration.stall.shm.np2.victim1
         COMMAND sh ${HVD_SH}/run_stall.sh $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_stall> 2 1)
add_test(NAME integration.mismatch.shm.np3
         COMMAND hvdrun -np 3 -- $<TARGET_FILE:test_mismatch>)
set_tests_properties(integration.peer_lost.shm.np3.victim1
                     integration.stall.shm.np2.victim1
                     integration.mismatch.shm.np3 PROPERTIES
                     LABELS "integration;failure;paths;transport" TIMEOUT 120
                     ENVIRONMENT "HVD_TRANSPORT=shm")

# hvd-tune writes a tuning file that HVD_TUNING_FILE then reads, and the
# collectives stay exact on the paths it chose.
add_test(NAME integration.paths.tuning_file
         COMMAND sh ${HVD_SH}/run_tune.sh $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:hvd-tune> $<TARGET_FILE:test_collectives>)
set_tests_properties(integration.paths.tuning_file PROPERTIES
                     LABELS "integration;paths" TIMEOUT 300)
