# cpp-httplib for `fp4kv serve` (optional: without it the server is not built and
# `fp4kv serve` is absent). Two forms:
#  - FP4KV_HTTPLIB_INCLUDE_DIR=<dir holding upstream's single-file httplib.h>: header-only,
#    no library, no TLS (what a machine without the package uses; carry the header there);
#  - otherwise the system package (Debian libcpp-httplib-dev): the split header plus
#    libcpp-httplib.so. Its classes were compiled with TLS, zlib and brotli switched on, so
#    we compile against the same switches (from pkg-config when present): a header read
#    with other switches would lay the classes out differently from the library.
# Result: FP4KV_HAVE_HTTPLIB and the target fp4kv_httplib.
set(FP4KV_HTTPLIB_INCLUDE_DIR "" CACHE PATH "Directory of a header-only (single-file) httplib.h")
set(FP4KV_HAVE_HTTPLIB OFF)
if(FP4KV_HTTPLIB_INCLUDE_DIR)
  if(NOT EXISTS "${FP4KV_HTTPLIB_INCLUDE_DIR}/httplib.h")
    message(FATAL_ERROR "FP4KV_HTTPLIB_INCLUDE_DIR: no httplib.h in '${FP4KV_HTTPLIB_INCLUDE_DIR}'")
  endif()
  add_library(fp4kv_httplib INTERFACE)
  target_include_directories(fp4kv_httplib SYSTEM INTERFACE "${FP4KV_HTTPLIB_INCLUDE_DIR}")
  target_link_libraries(fp4kv_httplib INTERFACE Threads::Threads)
  set(FP4KV_HAVE_HTTPLIB ON)
  message(STATUS "fp4kv: cpp-httplib header-only from ${FP4KV_HTTPLIB_INCLUDE_DIR}")
else()
  find_path(FP4KV_HTTPLIB_HEADER_DIR httplib.h)
  find_library(FP4KV_HTTPLIB_LIBRARY cpp-httplib)
  if(FP4KV_HTTPLIB_HEADER_DIR AND FP4KV_HTTPLIB_LIBRARY)
    # The package's compile switches; Debian's when pkg-config is missing.
    set(_fp4kv_httplib_defs CPPHTTPLIB_OPENSSL_SUPPORT CPPHTTPLIB_ZLIB_SUPPORT CPPHTTPLIB_BROTLI_SUPPORT)
    find_package(PkgConfig QUIET)
    if(PKG_CONFIG_FOUND)
      pkg_check_modules(FP4KV_HTTPLIB_PC QUIET cpp-httplib)
      if(FP4KV_HTTPLIB_PC_FOUND)
        set(_fp4kv_httplib_defs "")
        foreach(flag IN LISTS FP4KV_HTTPLIB_PC_CFLAGS_OTHER)
          if(flag MATCHES "^-D(.+)$")
            list(APPEND _fp4kv_httplib_defs "${CMAKE_MATCH_1}")
          endif()
        endforeach()
      endif()
    endif()
    add_library(fp4kv_httplib INTERFACE)
    target_include_directories(fp4kv_httplib SYSTEM INTERFACE "${FP4KV_HTTPLIB_HEADER_DIR}")
    target_compile_definitions(fp4kv_httplib INTERFACE ${_fp4kv_httplib_defs})
    target_link_libraries(fp4kv_httplib INTERFACE "${FP4KV_HTTPLIB_LIBRARY}" Threads::Threads)
    set(FP4KV_HAVE_HTTPLIB ON)
    message(STATUS "fp4kv: cpp-httplib ${FP4KV_HTTPLIB_LIBRARY} (${_fp4kv_httplib_defs})")
  else()
    message(STATUS "fp4kv: cpp-httplib not found: `fp4kv serve` is not built (see README, Serving)")
  endif()
endif()
