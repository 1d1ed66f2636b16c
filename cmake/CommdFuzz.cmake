# commd_fuzz_target(TARGET): makes TARGET a libFuzzer binary (COMMD_FUZZ=ON, clang only) with
# AddressSanitizer and UBSan; undefined behaviour stops the run like a crash does.
if(COMMD_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "COMMD_FUZZ=ON needs clang (CMAKE_CXX_COMPILER=clang++), not "
                      "${CMAKE_CXX_COMPILER_ID}")
endif()

set(COMMD_FUZZ_FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)

function(commd_fuzz_target target)
  target_compile_options(${target} PRIVATE ${COMMD_FUZZ_FLAGS} -fno-omit-frame-pointer)
  target_link_options(${target} PRIVATE ${COMMD_FUZZ_FLAGS})
endfunction()
