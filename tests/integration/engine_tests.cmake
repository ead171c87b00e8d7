# Integration tests of the background engine, included by
# integration/CMakeLists.txt. One program (test_engine SUBTEST), each subtest run
# through run_engine_logs.sh, which sets the environment it needs and checks
# its logs.
add_executable(test_engine ${CMAKE_CURRENT_SOURCE_DIR}/test_engine.c)
target_link_libraries(test_engine PRIVATE hvd Threads::Threads m)
target_include_directories(test_engine PRIVATE
                           ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_engine PRIVATE ${HVD_WARNINGS})

foreach(subtest order threads fusion cache mismatch join stall stall_shutdown
        timeline callback)
  if(subtest MATCHES "^(stall|stall_shutdown|timeline)$")
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
