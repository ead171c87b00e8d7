# The wheel's layout, when pip builds hvd through scikit-build-core
# (pyproject.toml; SKBUILD is set). Included by the top-level
# CMakeLists.txt instead of the system install rules:
# - the hvd package at the root of the wheel's platlib (site-packages): its
#   .py files only (the TensorFlow op library's sources, hvd/tensorflow/_ops,
#   are built into libhvd_tensorflow.so, not shipped; the sdist has them);
# - libhvd inside it, as hvd/libhvd.so, which the package loads first
#   (python/hvd/_lib.py), so no loader path is needed;
# - hvdrun, hvd-bench and hvd-tune in the scripts folder, which pip puts
#   on PATH (the venv's bin/).
# The tools link the static library, so they need no libhvd beside them.
install(DIRECTORY ${CMAKE_SOURCE_DIR}/python/hvd
        DESTINATION ${SKBUILD_PLATLIB_DIR}
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE
        PATTERN "_ops" EXCLUDE)
install(FILES $<TARGET_FILE:hvd> DESTINATION ${SKBUILD_PLATLIB_DIR}/hvd
        RENAME libhvd.so)
install(TARGETS hvdrun hvd-bench hvd-tune
        RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR})
# The TensorFlow ops, beside hvd.tensorflow, which looks there first; built
# only when the environment being installed into imports TensorFlow.
if(HVD_WITH_TENSORFLOW)
  install(TARGETS hvd_tensorflow hvd_tensorflow_gpu
          LIBRARY DESTINATION ${SKBUILD_PLATLIB_DIR}/hvd/tensorflow)
  message(STATUS "wheel: hvd package, hvd/libhvd.so, hvd/tensorflow/libhvd_tensorflow{,_gpu}.so, hvdrun, hvd-bench, hvd-tune")
else()
  message(STATUS "wheel: hvd package, hvd/libhvd.so, hvdrun, hvd-bench, hvd-tune")
  message(WARNING "hvd: no TensorFlow ops in this wheel (${HVD_TF_NOTE}). "
          "For hvd.tensorflow: pip install tensorflow-cpu (or tensorflow) "
          "into this environment first, then pip install hvd again.")
endif()
