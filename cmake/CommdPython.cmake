# COMMD_PYTHON: the Python binding (python/CMakeLists.txt) when pybind11 is there (Debian's
# pybind11-dev and python3-dev; scripts/install-deps installs them).
if(COMMD_PYTHON STREQUAL "OFF")
  return()
endif()
# Debian's python3 by default: the .deb ships the module for it, and the tests use its
# python3-pytest and python3-numpy (a pyenv or venv python3 earlier on PATH may lack them).
if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Python the binding is built for")
endif()
find_package(Python 3 COMPONENTS Interpreter Development.Module)
find_package(pybind11 CONFIG QUIET)
if(Python_FOUND AND pybind11_FOUND)
  add_subdirectory(python)
  # The module is the package's first file that loads libcommd_client.so.0, which
  # dpkg-shlibdeps must find in the build tree (a library of the package itself, so no
  # Depends entry for it).
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/client)
elseif(COMMD_PYTHON STREQUAL "ON")
  message(FATAL_ERROR "COMMD_PYTHON=ON needs python3-dev and pybind11-dev")
else()
  message(STATUS "Python binding: off (pybind11 or the Python headers not found)")
endif()
