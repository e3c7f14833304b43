# System dependencies from Debian packages (installed by launch/setup.sh).
find_package(MPI REQUIRED COMPONENTS C)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 2 REQUIRED)  # libcli11-dev: the gmod command line (header-only)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# libsimdjson-dev: the cold start's record scan (data/record_lengths.h).
pkg_check_modules(SIMDJSON REQUIRED IMPORTED_TARGET simdjson)
# libcpp-httplib-dev: the HTTP server of `gmod serve` (Debian builds it as httplib.h plus libcpp-httplib.so).
pkg_check_modules(HTTPLIB IMPORTED_TARGET cpp-httplib)
if(NOT HTTPLIB_FOUND)
  message(FATAL_ERROR "cpp-httplib not found (pkg-config cpp-httplib): install Debian's libcpp-httplib-dev "
                      "(launch/setup.sh does)")
endif()
find_package(JPEG REQUIRED)
find_package(PNG REQUIRED)
find_package(Threads REQUIRED)
if(GMOD_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
