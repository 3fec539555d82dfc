# rankscope_bpf_object(NAME SOURCE file.bpf.c [HEADERS h...])
#
# Compiles one eBPF C program with clang (-target bpf, CO-RE against the
# running kernel's BTF) and turns the object into a libbpf skeleton header,
# NAME.skel.h, in the build tree. The result is an INTERFACE target NAME_skel
# that carries the include path of the skeleton and of the shared event
# header; link it to get both. Generated files are never committed.

set(RANKSCOPE_BPF_GEN_DIR ${CMAKE_BINARY_DIR}/bpf-gen)
set(RANKSCOPE_VMLINUX_BTF /sys/kernel/btf/vmlinux CACHE FILEPATH
    "Kernel BTF used to generate vmlinux.h for CO-RE")

add_custom_command(
  OUTPUT ${RANKSCOPE_BPF_GEN_DIR}/vmlinux.h
  COMMAND ${CMAKE_COMMAND} -E make_directory ${RANKSCOPE_BPF_GEN_DIR}
  COMMAND ${RANKSCOPE_BPFTOOL} btf dump file ${RANKSCOPE_VMLINUX_BTF} format c > ${RANKSCOPE_BPF_GEN_DIR}/vmlinux.h
  COMMENT "Generating vmlinux.h from ${RANKSCOPE_VMLINUX_BTF}"
  VERBATIM)
add_custom_target(rankscope_vmlinux_h DEPENDS ${RANKSCOPE_BPF_GEN_DIR}/vmlinux.h)

function(rankscope_bpf_object NAME)
  cmake_parse_arguments(ARG "" "SOURCE" "HEADERS" ${ARGN})
  if(NOT ARG_SOURCE)
    message(FATAL_ERROR "rankscope_bpf_object(${NAME}): SOURCE is required")
  endif()
  get_filename_component(src ${ARG_SOURCE} ABSOLUTE)
  set(obj ${RANKSCOPE_BPF_GEN_DIR}/${NAME}.bpf.o)
  set(skel ${RANKSCOPE_BPF_GEN_DIR}/${NAME}.skel.h)
  set(hdrs)
  foreach(h IN LISTS ARG_HEADERS)
    get_filename_component(habs ${h} ABSOLUTE)
    list(APPEND hdrs ${habs})
  endforeach()

  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${RANKSCOPE_CLANG} -g -O2 -target bpf -D__TARGET_ARCH_x86
            -Wall -Wno-unused-function -Werror=implicit-function-declaration
            -I${RANKSCOPE_BPF_GEN_DIR} -I${CMAKE_SOURCE_DIR}
            -c ${src} -o ${obj}
    DEPENDS ${src} ${hdrs} rankscope_vmlinux_h
    COMMENT "BPF ${NAME}: compiling ${ARG_SOURCE}"
    VERBATIM)
  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${RANKSCOPE_BPFTOOL} gen skeleton ${obj} name ${NAME} > ${skel}
    DEPENDS ${obj}
    COMMENT "BPF ${NAME}: generating skeleton"
    VERBATIM)
  add_custom_target(${NAME}_skel_gen DEPENDS ${skel})
  add_library(${NAME}_skel INTERFACE)
  add_dependencies(${NAME}_skel ${NAME}_skel_gen)
  target_include_directories(${NAME}_skel INTERFACE ${RANKSCOPE_BPF_GEN_DIR} ${CMAKE_SOURCE_DIR})
  target_link_libraries(${NAME}_skel INTERFACE rankscope::libbpf)
endfunction()
