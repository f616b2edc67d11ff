# cmake -P script behind the fp4kv_install_consumer test (tests/install/CMakeLists.txt):
#   1. cmake --install <build> --prefix <work>/prefix   (a fresh, empty prefix)
#   2. configure tests/install/consumer with CMAKE_PREFIX_PATH=<work>/prefix, same
#      generator, compilers and build type as the build under test
#   3. build it, run it, require exit 0 and its verdict line ("attention linked" too when
#      the package has the CUDA layers).
# Any failure ends the script with FATAL_ERROR, which fails the test.
foreach(var FP4KV_BUILD_DIR FP4KV_WORK_DIR FP4KV_CONSUMER_DIR FP4KV_GENERATOR FP4KV_CXX_COMPILER)
  if(NOT ${var})
    message(FATAL_ERROR "run_install_test.cmake: ${var} not set")
  endif()
endforeach()
set(prefix ${FP4KV_WORK_DIR}/prefix)
set(consumer_build ${FP4KV_WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${FP4KV_WORK_DIR})
file(MAKE_DIRECTORY ${FP4KV_WORK_DIR})

function(step name)
  message(STATUS "[install test] ${name}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "[install test] ${name} failed (${rc}):\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(config_args "")
if(FP4KV_CONFIG)
  list(APPEND config_args --config ${FP4KV_CONFIG})
endif()
step(install ${CMAKE_COMMAND} --install ${FP4KV_BUILD_DIR} --prefix ${prefix} ${config_args})

# Only the package is visible: headers from the prefix, no source-tree include path.
foreach(f bin/fp4kv include/fp4kv/core/recipe.h lib/cmake/fp4kv/fp4kvConfig.cmake
          lib/cmake/fp4kv/fp4kvConfigVersion.cmake lib/cmake/fp4kv/fp4kvTargets.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "[install test] ${f} missing from the installed tree")
  endif()
endforeach()
# The installed CLI starts (its CUDA runtime found through its RUNPATH in CUDA builds).
step(cli ${prefix}/bin/fp4kv --help)
if(EXISTS ${prefix}/include/fp4kv/testing)
  message(FATAL_ERROR "[install test] test support (fp4kv/testing) must not be installed")
endif()

set(configure_args -S ${FP4KV_CONSUMER_DIR} -B ${consumer_build} -G ${FP4KV_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${FP4KV_CXX_COMPILER})
if(FP4KV_MAKE_PROGRAM)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${FP4KV_MAKE_PROGRAM})
endif()
if(FP4KV_CONFIG)
  list(APPEND configure_args -DCMAKE_BUILD_TYPE=${FP4KV_CONFIG})
endif()
if(FP4KV_HAVE_CUDA AND FP4KV_CUDA_COMPILER)
  list(APPEND configure_args -DCMAKE_CUDA_COMPILER=${FP4KV_CUDA_COMPILER})
endif()
step(configure ${CMAKE_COMMAND} ${configure_args})
step(build ${CMAKE_COMMAND} --build ${consumer_build} ${config_args})

file(GLOB_RECURSE exe LIST_DIRECTORIES false ${consumer_build}/fp4kv_consumer ${consumer_build}/fp4kv_consumer.exe)
if(NOT exe)
  message(FATAL_ERROR "[install test] fp4kv_consumer not built")
endif()
list(GET exe 0 exe)
execute_process(COMMAND ${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "[install test] consumer (exit ${rc}):\n${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "fp4kv consumer: OK")
  message(FATAL_ERROR "[install test] the consumer failed")
endif()
if(FP4KV_HAVE_CUDA AND NOT out MATCHES "fp4kv consumer: attention linked")
  message(FATAL_ERROR "[install test] CUDA build, but the consumer did not use fp4kv::attention")
endif()
