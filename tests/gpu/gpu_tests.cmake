# Tests of gpu/, included by tests/CMakeLists.txt.
#
# Label unit: the staging pipeline's scheduling (a simulated stream and
# network, no GPU needed), run everywhere.
add_executable(test_stage ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_stage.c)
target_link_libraries(test_stage PRIVATE hvd_internal PkgConfig::CMOCKA m)
target_compile_options(test_stage PRIVATE ${HVD_WARNINGS})
add_test(NAME unit.stage COMMAND test_stage)
set_tests_properties(unit.stage PROPERTIES LABELS unit TIMEOUT 300)
