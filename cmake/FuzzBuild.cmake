# The fuzz build: a tree of its own (build/fuzz), configured by
# tests/CMakeLists.txt with clang, holding the fuzz targets and only the
# libraries they link, all compiled with libFuzzer's coverage
# instrumentation, AddressSanitizer and UndefinedBehaviorSanitizer (any
# report is fatal). The rest of the project is built by the default compiler
# in the main tree.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "rankscope: the fuzz build needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}")
endif()

add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
                    -Wall -Wextra -Wno-unused-parameter)
add_link_options(-fsanitize=address,undefined)

include(Dependencies)

add_subdirectory(common)
add_subdirectory(proto)
# Only the libraries the fuzz targets link are built from these.
add_subdirectory(collector EXCLUDE_FROM_ALL)
add_subdirectory(node-agent EXCLUDE_FROM_ALL)
add_subdirectory(tests/fuzz)
