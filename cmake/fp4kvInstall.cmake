# Install rules and the exported CMake package: `cmake --install build --prefix P` puts the
# static libraries, the public headers, the `fp4kv` CLI and P/lib/cmake/fp4kv/ (package
# config, version, targets) there, so another project writes
#   find_package(fp4kv 0.1 REQUIRED [COMPONENTS attention])
#   target_link_libraries(app PRIVATE fp4kv::attention)   # or ::core ::ref ::model ::eval ::cache
# Included at the end of the top-level CMakeLists.txt, after every layer is defined; a layer
# that is not built here (fp4kv_attention without CUDA) is skipped. Test/bench support
# (fp4kv_testing, bench/) is never installed.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FP4KV_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/fp4kv)

# The layers, lowest first (the package's component names).
set(_fp4kv_all_layers core ref model eval engine cache attention ops)
set(FP4KV_INSTALLED_LAYERS "")
set(_fp4kv_targets "")
foreach(_layer IN LISTS _fp4kv_all_layers)
  if(NOT TARGET fp4kv_${_layer})
    continue()
  endif()
  if(NOT TARGET fp4kv::${_layer})
    add_library(fp4kv::${_layer} ALIAS fp4kv_${_layer})  # same name in-tree as installed
  endif()
  set_target_properties(fp4kv_${_layer} PROPERTIES EXPORT_NAME ${_layer})
  list(APPEND FP4KV_INSTALLED_LAYERS ${_layer})
  list(APPEND _fp4kv_targets fp4kv_${_layer})

  # Public headers: every .h of the layer's folder, keeping fp4kv/<layer>/... . None of
  # them includes a .cuh (the kernel templates stay internal). Without CUDA, the headers
  # that need the CUDA runtime (the GPU cache API) are left out: nothing implements them.
  file(GLOB_RECURSE _headers CONFIGURE_DEPENDS
       RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/fp4kv/${_layer}/*.h)
  foreach(_header IN LISTS _headers)
    if(NOT FP4KV_HAVE_CUDA)
      file(STRINGS ${PROJECT_SOURCE_DIR}/${_header} _cuda_includes REGEX "^#include <cuda")
      if(_cuda_includes)
        continue()
      endif()
    endif()
    get_filename_component(_dir ${_header} DIRECTORY)
    install(FILES ${_header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${_dir} COMPONENT fp4kv_dev)
  endforeach()
endforeach()

install(TARGETS ${_fp4kv_targets} EXPORT fp4kvTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT fp4kv_dev
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT fp4kv_runtime
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT fp4kv_runtime)
install(EXPORT fp4kvTargets NAMESPACE fp4kv:: DESTINATION ${FP4KV_INSTALL_CMAKEDIR}
        FILE fp4kvTargets.cmake COMPONENT fp4kv_dev)

# The CLI. It links the CUDA runtime from the toolkit (not a system directory) in CUDA
# builds: keep that directory in the installed binary's RUNPATH.
if(TARGET fp4kv)
  set_target_properties(fp4kv PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS fp4kv RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT fp4kv_runtime)
endif()

# Package config: what the installed static libraries need from the system (private
# dependencies of a static library are exported as $<LINK_ONLY:...>), and whether the CUDA
# layers are in it. The CUDA toolkit this was built with is a hint for find_package users.
set(FP4KV_CUDA_TOOLKIT_ROOT "")
if(FP4KV_HAVE_CUDA AND CUDAToolkit_BIN_DIR)
  get_filename_component(FP4KV_CUDA_TOOLKIT_ROOT ${CUDAToolkit_BIN_DIR} DIRECTORY)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/fp4kvConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/fp4kvConfig.cmake
                              INSTALL_DESTINATION ${FP4KV_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/fp4kvConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/fp4kvConfig.cmake ${PROJECT_BINARY_DIR}/fp4kvConfigVersion.cmake
        DESTINATION ${FP4KV_INSTALL_CMAKEDIR} COMPONENT fp4kv_dev)
