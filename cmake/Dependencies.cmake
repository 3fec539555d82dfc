# One target name per dependency, whatever its origin. Every package comes
# from Debian (scripts/install-deps.sh); nothing is downloaded by the build.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)

pkg_check_modules(LIBBPF REQUIRED IMPORTED_TARGET libbpf>=1.0)
add_library(rankscope::libbpf ALIAS PkgConfig::LIBBPF)

pkg_check_modules(LIBZMQ REQUIRED IMPORTED_TARGET libzmq>=4.3)
add_library(rankscope::zmq ALIAS PkgConfig::LIBZMQ)
find_path(CPPZMQ_INCLUDE_DIR zmq.hpp REQUIRED)
# libsodium (libzmq's CurveZMQ is built on it): BLAKE2b digests of the
# usage ledger's identities, whose strings the users choose.
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium>=1.0.18)
add_library(rankscope::sodium ALIAS PkgConfig::SODIUM)
# zstd: batches compressed on the wire to a collector that reads them
# (proto/compress.h; RocksDB already pulls the library in).
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd>=1.4)
add_library(rankscope::zstd ALIAS PkgConfig::ZSTD)

find_package(CapnProto CONFIG REQUIRED)
find_package(RocksDB CONFIG REQUIRED)
find_package(Boost 1.74 REQUIRED COMPONENTS program_options)
find_package(prometheus-cpp CONFIG REQUIRED)
# libcurl: the HTTP client to Alertmanager (TLS, CAs and client
# certificates, basic auth and bearer tokens, proxies).
find_package(CURL 7.85 REQUIRED)
# nlohmann-json: JSON-RPC in `rankscope mcp` (parsing what a client sends).
find_package(nlohmann_json 3 REQUIRED)

find_program(RANKSCOPE_CLANG NAMES clang clang-14 REQUIRED)
find_program(RANKSCOPE_BPFTOOL NAMES bpftool PATHS /usr/sbin /usr/local/sbin REQUIRED)
