# File: tests/consumer/driver/run_consumer.cmake — one consumer check, run by ctest as
#   cmake -DMODE=find_package|add_subdirectory|pkg_config -DSOURCE_DIR=… -DBINARY_DIR=…
#         -DWORK_DIR=… -DCXX=… -P driver/run_consumer.cmake
# find_package and pkg_config first install pdcoll's build tree into
# WORK_DIR/prefix with `cmake --install`; every mode then builds
# tests/consumer/main.cpp the way a user would (without the sanitizer flags of
# the tree under test) and runs it on 2 ranks with pdcoll-run (the installed
# one where there is an install).
cmake_minimum_required(VERSION 3.22)
foreach(var MODE SOURCE_DIR BINARY_DIR WORK_DIR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=… is required")
  endif()
endforeach()

# Runs a command, echoes it, and fails the test when it fails.
function(consumer_step)
  string(REPLACE ";" " " shown "${ARGV}")
  message(STATUS "consumer[${MODE}]: ${shown}")
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer[${MODE}]: failed (${rc}): ${shown}")
  endif()
endfunction()

set(consumer_dir ${SOURCE_DIR}/tests/consumer)
set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${build})
# A consumer is configured with its own flags, not the sanitizer flags that
# the tree under test may have passed through the environment.
unset(ENV{CXXFLAGS})
unset(ENV{LDFLAGS})

if(MODE STREQUAL "find_package" OR MODE STREQUAL "pkg_config")
  consumer_step(${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${prefix})
  foreach(installed include/pdcoll/pdcoll.hpp lib/cmake/pdcoll/pdcollConfig.cmake
                    lib/cmake/pdcoll/pdcollConfigVersion.cmake lib/cmake/pdcoll/pdcollTargets.cmake
                    share/pkgconfig/pdcoll.pc bin/pdcoll-run)
    if(NOT EXISTS ${prefix}/${installed})
      message(FATAL_ERROR "consumer[${MODE}]: the install lacks ${installed}")
    endif()
  endforeach()
  set(launcher ${prefix}/bin/pdcoll-run)
else()
  set(launcher ${SOURCE_DIR}/tools/pdcoll-run)
endif()

if(MODE STREQUAL "find_package")
  consumer_step(${CMAKE_COMMAND} -S ${consumer_dir}/find_package -B ${build}
                -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${prefix})
  consumer_step(${CMAKE_COMMAND} --build ${build})
  set(program ${build}/consumer)
elseif(MODE STREQUAL "add_subdirectory")
  consumer_step(${CMAKE_COMMAND} -S ${consumer_dir}/add_subdirectory -B ${build}
                -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=${CXX} -DPDCOLL_SOURCE_DIR=${SOURCE_DIR})
  consumer_step(${CMAKE_COMMAND} --build ${build})
  set(program ${build}/consumer)
elseif(MODE STREQUAL "pkg_config")
  find_program(PKG_CONFIG pkg-config REQUIRED)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/share/pkgconfig)
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs pdcoll
                  OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer[pkg_config]: pkg-config --cflags --libs pdcoll failed")
  endif()
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(program ${build}/consumer)
  consumer_step(${CXX} -std=c++20 ${consumer_dir}/main.cpp -o ${program} ${flags})
else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE ${MODE}")
endif()

consumer_step(${launcher} -n 2 --timeout 60 ${program})
