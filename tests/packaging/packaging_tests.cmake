# pip install of a fresh clone (pyproject.toml, cmake/wheel.cmake), included
# by tests/CMakeLists.txt. Skips (77) where no package index is reachable.
add_test(NAME packaging.pip_install
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/run_pip_install.sh
                 "${HVD_PYTHON}" "${HVD_TF_PYTHON}")
set_tests_properties(packaging.pip_install PROPERTIES
                     LABELS packaging TIMEOUT 900 SKIP_RETURN_CODE 77)
