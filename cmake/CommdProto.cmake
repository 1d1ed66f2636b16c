# commd_proto_library(NAME PROTOS a.proto b.proto [ROOT dir] [DEPS lib...] [GRPC])
# Generates C++ (and gRPC stubs with GRPC) at build time from .proto files under ROOT
# (default: proto/), whose paths below ROOT are their import names.
function(commd_proto_library name)
  cmake_parse_arguments(ARG "GRPC" "ROOT" "PROTOS;DEPS" ${ARGN})
  set(proto_root ${PROJECT_SOURCE_DIR}/proto)
  set(out_root ${PROJECT_BINARY_DIR}/proto_gen)
  if(ARG_ROOT)
    get_filename_component(proto_root ${ARG_ROOT} ABSOLUTE)
    set(out_root ${CMAKE_CURRENT_BINARY_DIR}/proto_gen)
  endif()
  set(srcs)
  foreach(proto ${ARG_PROTOS})
    get_filename_component(abs ${proto} ABSOLUTE)
    file(RELATIVE_PATH rel ${proto_root} ${abs})
    string(REGEX REPLACE "\\.proto$" "" stem ${rel})
    set(outs ${out_root}/${stem}.pb.cc ${out_root}/${stem}.pb.h)
    set(plugin_args)
    if(ARG_GRPC)
      list(APPEND outs ${out_root}/${stem}.grpc.pb.cc ${out_root}/${stem}.grpc.pb.h)
      set(plugin_args --grpc_out=${out_root} --plugin=protoc-gen-grpc=${COMMD_GRPC_CPP_PLUGIN})
    endif()
    add_custom_command(
      OUTPUT ${outs}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${out_root}
      COMMAND protobuf::protoc --proto_path=${proto_root} --cpp_out=${out_root} ${plugin_args} ${abs}
      DEPENDS ${abs} protobuf::protoc
      COMMENT "protoc ${rel}"
      VERBATIM)
    list(APPEND srcs ${outs})
  endforeach()
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${out_root}>)
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf ${ARG_DEPS})
  if(ARG_GRPC)
    target_link_libraries(${name} PUBLIC gRPC::grpc++)
  endif()
  # Generated code is not ours to warn about.
  target_compile_options(${name} PRIVATE -w)
endfunction()
