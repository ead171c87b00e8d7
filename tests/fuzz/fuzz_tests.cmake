# The fuzz targets (tests/fuzz/fuzz_*.c). Two ways to build them:
# - HVD_FUZZ=ON (clang with libFuzzer; tests/fuzz/run-fuzzers does it in a
#   build directory of its own): each target is a libFuzzer binary, the
#   library built with -fsanitize=fuzzer-no-link,address,undefined;
# - otherwise (the regular test build, included by
#   tests/reliability/reliability_tests.cmake): each target gets a plain
#   main() (standalone.c) and ctest runs it over its corpus in the tree
#   (fuzz.<target>.corpus), so the targets keep building with gcc and the
#   corpus keeps passing, under the sanitizer builds too.
set(HVD_FUZZ_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz)
set(HVD_FUZZ_TARGETS frame handshake ctrl config)

foreach(name ${HVD_FUZZ_TARGETS})
  set(sources ${HVD_FUZZ_DIR}/fuzz_${name}.c)
  if(name STREQUAL "config")
    list(APPEND sources ${CMAKE_SOURCE_DIR}/tools/hostfile.c)
  endif()
  if(HVD_FUZZ)
    add_executable(fuzz_${name} ${sources})
    target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
  else()
    add_executable(fuzz_${name} ${sources} ${HVD_FUZZ_DIR}/standalone.c)
    add_test(NAME fuzz.${name}.corpus
             COMMAND fuzz_${name} ${HVD_FUZZ_DIR}/corpus/${name})
    set(labels fuzz unit)
    if(name STREQUAL "frame" OR name STREQUAL "handshake")
      list(APPEND labels transport)
    endif()
    set_tests_properties(fuzz.${name}.corpus PROPERTIES LABELS "${labels}"
                         TIMEOUT 300)
  endif()
  target_link_libraries(fuzz_${name} PRIVATE hvd_internal)
  target_include_directories(fuzz_${name} PRIVATE ${CMAKE_SOURCE_DIR})
  target_compile_options(fuzz_${name} PRIVATE ${HVD_WARNINGS})
endforeach()
