# Micro-benchmark of the reduction kernels (include/pdcoll/reduce/kernels.hpp)
# against memcpy. Build it optimised: cmake -DCMAKE_BUILD_TYPE=Release.
find_package(benchmark QUIET)
if(benchmark_FOUND)
  add_executable(reduce_kernels_bench ${CMAKE_CURRENT_LIST_DIR}/reduce_kernels_bench.cpp)
  target_link_libraries(reduce_kernels_bench PRIVATE pdcoll::pdcoll benchmark::benchmark)
else()
  message(STATUS "pdcoll: Google Benchmark not found; reduce_kernels_bench is not built")
endif()
