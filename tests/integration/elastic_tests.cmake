# Elastic jobs end to end (run_elastic.sh): test_elastic under hvdrun's
# elastic mode while workers are killed (20 times), a host is added and
# removed by the discovery script, and the job falls below --min-np.
add_executable(test_elastic ${CMAKE_CURRENT_SOURCE_DIR}/test_elastic.c)
target_link_libraries(test_elastic PRIVATE hvd Threads::Threads m)
target_include_directories(test_elastic PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_elastic PRIVATE ${HVD_WARNINGS})

foreach(case kills shrink state-lost min-np grow laggard late-join no-server)
  add_test(NAME integration.elastic.${case}
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/run_elastic.sh
                   $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_elastic> ${case})
  set_tests_properties(integration.elastic.${case} PROPERTIES
                       LABELS "integration;elastic" TIMEOUT 300)
endforeach()
# "beside" (tools/run-tests): these wait on restarts and timeouts most of
# their time, so they run beside the rest of the suite.
set_property(TEST integration.elastic.kills integration.elastic.shrink
             integration.elastic.laggard integration.elastic.late-join
             APPEND PROPERTY LABELS beside)
