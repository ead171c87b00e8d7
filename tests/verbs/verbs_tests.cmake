# The verbs transport's tests, included by tests/CMakeLists.txt (only in a
# build with libibverbs).
#
# Unit tests (cmocka, no device needed): connection data, the protocol's
# pure logic (headers, credits, chunks), the registration cache and device
# selection against a fake libibverbs, and the transport itself over the
# fake's in-process loopback fabric (tests/unit/verbs_fake.h).
#
# Integration tests through hvdrun: the collectives suite and the failure
# tests over HVD_TRANSPORT=verbs, which SKIP (77) without a usable RDMA
# device (soft-RoCE, rdma_rxe, counts as one); the refusal of
# HVD_TRANSPORT=verbs where there is none; auto staying on TCP in a
# one-host job.
if(NOT HVD_WITH_VERBS)
  return()
endif()

set(HVD_VT ${CMAKE_CURRENT_SOURCE_DIR})
add_library(verbs_fake STATIC ${HVD_VT}/unit/verbs_fake.c)
target_link_libraries(verbs_fake PUBLIC hvd_internal Threads::Threads)
target_include_directories(verbs_fake PUBLIC ${HVD_VT}/unit)
target_compile_options(verbs_fake PRIVATE ${HVD_WARNINGS})

foreach(name verbs_conn verbs_proto verbs_mr verbs_device verbs_fabric
        verbs_gpudirect)
  add_executable(test_${name} ${HVD_VT}/unit/test_${name}.c)
  target_link_libraries(test_${name} PRIVATE verbs_fake hvd_internal
                        PkgConfig::CMOCKA m)
  target_compile_options(test_${name} PRIVATE ${HVD_WARNINGS})
  add_test(NAME unit.${name} COMMAND test_${name})
  set_tests_properties(unit.${name} PROPERTIES LABELS "unit;verbs;transport"
                       TIMEOUT 300)
endforeach()

add_executable(verbs_probe ${HVD_VT}/integration/verbs_probe.c)
target_link_libraries(verbs_probe PRIVATE hvd_internal)
target_compile_options(verbs_probe PRIVATE ${HVD_WARNINGS})
add_executable(test_verbs_refusal ${HVD_VT}/integration/test_verbs_refusal.c)
target_link_libraries(test_verbs_refusal PRIVATE hvd)
target_compile_options(test_verbs_refusal PRIVATE ${HVD_WARNINGS})

set(HVD_RUN_VERBS sh ${HVD_VT}/integration/run_verbs.sh
    $<TARGET_FILE:verbs_probe>)

add_test(NAME verbs.refusal.np2
         COMMAND ${HVD_RUN_VERBS} refuse $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_verbs_refusal>)
add_test(NAME verbs.auto_one_host.np2
         COMMAND ${HVD_RUN_VERBS} auto $<TARGET_FILE:hvdrun>
                 $<TARGET_FILE:test_collectives>)

# Over a device: the collectives suite, with the default ring and with
# tiny chunks (credits cycle) and user buffers registered.
foreach(np 2 3)
  add_test(NAME verbs.collectives.np${np}
           COMMAND ${HVD_RUN_VERBS} run $<TARGET_FILE:hvdrun> -np ${np} --
                   $<TARGET_FILE:test_collectives> --max-count 1048576)
endforeach()
add_test(NAME verbs.collectives.np3.small_ring
         COMMAND ${HVD_RUN_VERBS} run $<TARGET_FILE:hvdrun> -np 3 --
                 $<TARGET_FILE:test_collectives> --max-count 262144)
set_tests_properties(verbs.collectives.np3.small_ring PROPERTIES ENVIRONMENT
  "HVD_IB_CHUNK_BYTES=4K;HVD_IB_RING_CHUNKS=2;HVD_IB_MR_CACHE=on")
add_test(NAME verbs.peer_lost.np3
         COMMAND ${HVD_RUN_VERBS} run sh ${HVD_VT}/integration/run_peer_lost.sh
                 $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_peer_lost> 3 1 40)
add_test(NAME verbs.stall.np2
         COMMAND ${HVD_RUN_VERBS} run sh ${HVD_VT}/integration/run_stall.sh
                 $<TARGET_FILE:hvdrun> $<TARGET_FILE:test_stall> 2 1)
set_tests_properties(verbs.refusal.np2 verbs.auto_one_host.np2
                     verbs.collectives.np2 verbs.collectives.np3
                     verbs.collectives.np3.small_ring verbs.peer_lost.np3
                     verbs.stall.np2 PROPERTIES
                     LABELS "integration;verbs;transport" TIMEOUT 600
                     SKIP_RETURN_CODE 77)
set_tests_properties(verbs.peer_lost.np3 verbs.stall.np2 PROPERTIES
                     LABELS "integration;verbs;failure;transport")
