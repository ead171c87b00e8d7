# pip install of a fresh clone (pyproject.toml, cmake/wheel.cmake), included
# by tests/CMakeLists.txt. Skips (77) where no package index is reachable.
# Not in sanitizer builds: the wheel it builds is the same plain one there.
if(NOT HVD_ASAN AND NOT HVD_TSAN)
  add_test(NAME packaging.pip_install
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run_pip_install.sh
                   "${HVD_PYTHON}" "${HVD_TF_PYTHON}")
  set_tests_properties(packaging.pip_install PROPERTIES
                       LABELS packaging TIMEOUT 900 SKIP_RETURN_CODE 77)
endif()
