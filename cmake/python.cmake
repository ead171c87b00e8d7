# The Python package (python/hvd and hvd.torch): the interpreter its tests
# and examples run with, and where `cmake --install` puts it. Included by
# the top-level CMakeLists.txt.
#
# HVD_PYTHON defaults to Debian's /usr/bin/python3, the interpreter apt's
# python3-torch, python3-numpy and python3-pytest are installed for; a
# pyenv or virtualenv python3 that comes first on PATH usually lacks them.
if(EXISTS /usr/bin/python3)
  set(hvd_python_default /usr/bin/python3)
else()
  find_program(HVD_PYTHON_ON_PATH python3)
  set(hvd_python_default "${HVD_PYTHON_ON_PATH}")
endif()
set(HVD_PYTHON "${hvd_python_default}" CACHE FILEPATH
    "Python interpreter for the Python tests and examples (with torch, numpy, pytest)")

# lib/python3.X/dist-packages is on Debian's sys.path for the prefixes /usr
# and /usr/local; for another prefix, add it to PYTHONPATH.
set(hvd_python_version 3)
if(HVD_PYTHON)
  execute_process(
    COMMAND ${HVD_PYTHON} -c "import sys; print('%d.%d' % sys.version_info[:2])"
    OUTPUT_VARIABLE hvd_python_out OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE hvd_python_rc ERROR_QUIET)
  if(hvd_python_rc EQUAL 0)
    set(hvd_python_version ${hvd_python_out})
  endif()
endif()
set(HVD_PYTHON_INSTALL_DIR lib/python${hvd_python_version}/dist-packages
    CACHE STRING "Where cmake --install puts the hvd Python package (relative to the prefix, or absolute)")

# The installed package finds the installed libhvd through hvd/_install.py,
# which holds the path from the package to the library folder. Both are
# relative to the prefix (unless set absolute), so the path stays right
# under `cmake --install --prefix DIR`.
foreach(dir HVD_PYTHON_INSTALL_DIR CMAKE_INSTALL_LIBDIR)
  if(IS_ABSOLUTE "${${dir}}")
    set(hvd_abs_${dir} "${${dir}}")
  else()
    set(hvd_abs_${dir} "${CMAKE_INSTALL_PREFIX}/${${dir}}")
  endif()
endforeach()
file(RELATIVE_PATH HVD_PY_LIBDIR "${hvd_abs_HVD_PYTHON_INSTALL_DIR}/hvd"
     "${hvd_abs_CMAKE_INSTALL_LIBDIR}")
file(WRITE ${CMAKE_BINARY_DIR}/python/_install.py
     "# Written by cmake --install: the folder of libhvd, relative to this package.\nLIBDIR = \"${HVD_PY_LIBDIR}\"\n")
# The package's .py files; not the TensorFlow op library's sources
# (hvd/tensorflow/_ops), which are built into libhvd_tensorflow.so.
# Under pip (SKBUILD) cmake/wheel.cmake puts the package at the root of the
# wheel instead: these rules would add a second copy under
# lib/python3.X/dist-packages inside site-packages.
if(SKBUILD)
  return()
endif()
install(DIRECTORY ${CMAKE_SOURCE_DIR}/python/hvd
        DESTINATION ${HVD_PYTHON_INSTALL_DIR}
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE
        PATTERN "_ops" EXCLUDE)
install(FILES ${CMAKE_BINARY_DIR}/python/_install.py
        DESTINATION ${HVD_PYTHON_INSTALL_DIR}/hvd)
message(STATUS "Python package: ${HVD_PYTHON_INSTALL_DIR}/hvd, tests with ${HVD_PYTHON}")
