# One build truth: a target's sources and dependencies are declared once, in its folder's
# BUILD.bazel, and CMake reads them from there.
#
# commd_target(NAME) creates the CMake target NAME from the cc_library, cc_binary or cc_test of
# that name in ${CMAKE_CURRENT_SOURCE_DIR}/BUILD.bazel: srcs and hdrs become its sources, deps
# its link libraries (//pkg:x and :x are the CMake target x; @system//:x and @local_cuda//:x
# go through the table in cmake/bazel_build_reader.py), includes/strip_include_prefix its
# include directories. cc_library -> static library (deps PUBLIC, as Bazel propagates them),
# cc_binary -> executable, or a shared library with linkshared = True (deps PRIVATE),
# cc_test -> executable (deps PRIVATE). SDK_SHARED: a program links the SDK as trainers do,
# the shared commd_client, where Bazel links //client:commd_client_static. The workspace root is an include directory of every
# target, as Bazel's toolchain makes it.
#
# What stays in CMakeLists.txt is what only CMake says: options, test registration
# (gtest_discover_tests, add_test), install rules, custom commands, compile definitions and
# flags, add_dependencies on data (Bazel's `data`, `defines`, `copts` are not read: they carry
# runfiles paths).
#
# The BUILD file is read at configure time by cmake/bazel_build_reader.py into
# <build>/bazel_targets/<folder>.cmake; editing it re-runs the configure.
find_package(Python3 REQUIRED COMPONENTS Interpreter)

set(COMMD_BAZEL_READER ${CMAKE_CURRENT_LIST_DIR}/bazel_build_reader.py)

# Reads this folder's BUILD.bazel once per configure; sets COMMD_BAZEL_FILE in the caller.
function(_commd_bazel_read)
  file(RELATIVE_PATH package ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  set(out ${PROJECT_BINARY_DIR}/bazel_targets/${package}.cmake)
  get_property(done DIRECTORY PROPERTY COMMD_BAZEL_READ)
  if(NOT done)
    set(build_file ${CMAKE_CURRENT_SOURCE_DIR}/BUILD.bazel)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} ${COMMD_BAZEL_READER} ${PROJECT_SOURCE_DIR} ${package}
              ${CMAKE_CURRENT_BINARY_DIR} ${COMMD_HAVE_CUDA} ${out}
      RESULT_VARIABLE result ERROR_VARIABLE error)
    if(NOT result EQUAL 0)
      message(FATAL_ERROR "commd: cannot read the targets of ${build_file}:\n${error}")
    endif()
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${build_file}
                                                                   ${COMMD_BAZEL_READER})
    set_property(DIRECTORY PROPERTY COMMD_BAZEL_READ ON)
  endif()
  set(COMMD_BAZEL_FILE ${out} PARENT_SCOPE)
endfunction()

function(commd_target name)
  cmake_parse_arguments(ARG "SDK_SHARED" "" "" ${ARGN})
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "commd_target(${name}): unexpected arguments ${ARG_UNPARSED_ARGUMENTS}; "
                        "sources and dependencies belong in ${CMAKE_CURRENT_SOURCE_DIR}/BUILD.bazel")
  endif()
  _commd_bazel_read()
  include(${COMMD_BAZEL_FILE})
  set(p COMMD_BAZEL_${name})
  if(NOT DEFINED ${p}_KIND)
    message(FATAL_ERROR "commd_target(${name}): ${CMAKE_CURRENT_SOURCE_DIR}/BUILD.bazel has no "
                        "cc_library, cc_binary or cc_test named ${name} (in this configuration)")
  endif()
  set(sources ${${p}_SRCS} ${${p}_HDRS})
  if(${p}_KIND STREQUAL "cc_library")
    add_library(${name} STATIC ${sources})
    set(scope PUBLIC)
  elseif(${p}_KIND STREQUAL "cc_binary" AND ${p}_LINKSHARED)
    add_library(${name} SHARED ${sources})
    set(scope PRIVATE)
  else()
    add_executable(${name} ${sources})
    set(scope PRIVATE)
  endif()
  # Bazel includes from the workspace root everywhere; so does every user of a library here.
  if(${p}_KIND STREQUAL "cc_library")
    target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  else()
    target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  endif()
  foreach(dir ${${p}_INCLUDES})
    target_include_directories(${name} ${scope} $<BUILD_INTERFACE:${dir}>)
  endforeach()
  set(deps ${${p}_DEPS})
  if(ARG_SDK_SHARED)
    if(NOT commd_client_static IN_LIST deps)
      message(FATAL_ERROR "commd_target(${name} SDK_SHARED): ${${p}_WHERE} does not depend on "
                          "//client:commd_client_static")
    endif()
    list(TRANSFORM deps REPLACE "^commd_client_static$" commd_client)
  endif()
  if(deps)
    target_link_libraries(${name} ${scope} ${deps})
  endif()
  # For scripts/check-build-parity: where the target is declared, and which SDK it links.
  set_target_properties(${name} PROPERTIES COMMD_DECLARED_IN "${${p}_WHERE}"
                                           COMMD_SDK_SHARED "${ARG_SDK_SHARED}")
endfunction()

# Writes <build>/commd_targets.json at generate time: every library and executable of the
# build with its sources and link libraries as CMake uses them, for scripts/check-build-parity.
function(commd_write_target_list)
  set(dirs ${PROJECT_SOURCE_DIR})
  set(targets)
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(sub DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${sub})
    get_property(t DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    list(APPEND targets ${t})
  endwhile()
  # One JSON object a line; lists joined with "|" (a ";" would split CMake's own lists).
  set(body "")
  set(sep "")
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|EXECUTABLE)$")
      get_target_property(dir ${t} SOURCE_DIR)
      string(APPEND body "${sep}{\"name\": \"${t}\", \"source_dir\": \"${dir}\", "
        "\"sources\": \"$<JOIN:$<TARGET_PROPERTY:${t},SOURCES>,|>\", "
        "\"link\": \"$<JOIN:$<TARGET_PROPERTY:${t},LINK_LIBRARIES>,|>\", "
        "\"sdk_shared\": \"$<TARGET_PROPERTY:${t},COMMD_SDK_SHARED>\", "
        "\"declared_in\": \"$<TARGET_PROPERTY:${t},COMMD_DECLARED_IN>\"}")
      set(sep ",\n")
    endif()
  endforeach()
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/commd_targets.json CONTENT "[\n${body}\n]\n")
endfunction()
