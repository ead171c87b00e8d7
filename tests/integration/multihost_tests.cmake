# The multi-host test, included by integration/CMakeLists.txt: two network
# namespaces joined by a veth pair act as two hosts, each with its own sshd,
# and hvdrun -H starts two ranks on each (run_multihost.sh). It needs root,
# ip netns and OpenSSH's sshd and ssh; without them it is skipped (77).
add_executable(test_multihost
               ${CMAKE_CURRENT_SOURCE_DIR}/test_multihost.c)
target_link_libraries(test_multihost PRIVATE hvd Threads::Threads m)
target_include_directories(test_multihost PRIVATE
                           ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_options(test_multihost PRIVATE ${HVD_WARNINGS})

add_test(NAME integration.multihost
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/run_multihost.sh
                 $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_multihost>
                 $<TARGET_FILE:test_elastic>)
set_tests_properties(integration.multihost PROPERTIES
                     LABELS "integration;multihost;beside" TIMEOUT 300
                     SKIP_RETURN_CODE 77)
