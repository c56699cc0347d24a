# Micro-benchmark of registration_cache (include/pdcoll/registration/):
# hit latency by cache size, miss-plus-eviction cost, and the saving against
# real fi_mr_reg/fi_close on libfabric's tcp provider.
# Build it optimised: cmake -DCMAKE_BUILD_TYPE=Release.
find_package(benchmark QUIET)
if(benchmark_FOUND)
  add_executable(registration_cache_bench ${CMAKE_CURRENT_LIST_DIR}/registration_cache_bench.cpp)
  target_link_libraries(registration_cache_bench PRIVATE pdcoll::pdcoll benchmark::benchmark)
else()
  message(STATUS "pdcoll: Google Benchmark not found; registration_cache_bench is not built")
endif()
