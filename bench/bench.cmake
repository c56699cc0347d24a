# pdcoll-bench (bench/pdcoll_bench.cpp): nccl-tests-style benchmark of every
# collective; progress_bench (bench/progress_bench.cpp): one round trip
# through the progress engine; the MPI and Gloo baselines (bench/baselines/,
# built only when found). Build them optimised for measurements:
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DPDCOLL_BUILD_TESTS=OFF
#   cmake --build build-bench --target pdcoll-bench mpi_allreduce_bench gloo_allreduce_bench
# bench/compare.sh builds and runs all of them.
find_package(CLI11 QUIET)
if(CLI11_FOUND AND NOT TARGET pdcoll-bench)  # tests/multiproc/bench.cmake may have made it already
  add_executable(pdcoll-bench ${CMAKE_CURRENT_LIST_DIR}/pdcoll_bench.cpp)
  target_link_libraries(pdcoll-bench PRIVATE pdcoll::pdcoll CLI11::CLI11)
  # tests/support/reference.hpp: the deterministic inputs and the reference reduction.
  target_include_directories(pdcoll-bench PRIVATE ${PROJECT_SOURCE_DIR}/tests ${CMAKE_CURRENT_LIST_DIR})
elseif(NOT CLI11_FOUND)
  message(STATUS "pdcoll: CLI11 not found (libcli11-dev); pdcoll-bench is not built")
endif()

find_package(benchmark QUIET)
if(benchmark_FOUND)
  add_executable(progress_bench ${CMAKE_CURRENT_LIST_DIR}/progress_bench.cpp)
  target_link_libraries(progress_bench PRIVATE pdcoll::pdcoll benchmark::benchmark)
else()
  message(STATUS "pdcoll: Google Benchmark not found; progress_bench is not built")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/baselines/baselines.cmake)

# The TCP loopback ceiling of a ring all-reduce at each size (bench/tcp_ring_exchange.cpp):
# the ring's traffic with no reduction; bench/compare.sh sets pdcoll's TCP rows against it.
if(CLI11_FOUND)
  add_executable(tcp_ring_exchange ${CMAKE_CURRENT_LIST_DIR}/tcp_ring_exchange.cpp)
  target_link_libraries(tcp_ring_exchange PRIVATE pdcoll::pdcoll CLI11::CLI11)
endif()

# The floor under a small all-reduce over shared memory (bench/shm_latency_floor.cpp):
# cache-line mailboxes between forked processes, no library.
if(CLI11_FOUND AND NOT TARGET shm_latency_floor)  # tests/multiproc/bench.cmake may have made it already
  add_executable(shm_latency_floor ${CMAKE_CURRENT_LIST_DIR}/shm_latency_floor.cpp)
  target_link_libraries(shm_latency_floor PRIVATE pdcoll::pdcoll CLI11::CLI11)
endif()

# The floor under a small all-reduce over TCP loopback (bench/tcp_latency_floor.cpp):
# recursive doubling on plain sockets, to set pdcoll's 8-byte latency against.
if(CLI11_FOUND AND NOT TARGET tcp_latency_floor)  # tests/multiproc/bench.cmake may have made it already
  add_executable(tcp_latency_floor ${CMAKE_CURRENT_LIST_DIR}/tcp_latency_floor.cpp)
  target_link_libraries(tcp_latency_floor PRIVATE pdcoll::pdcoll CLI11::CLI11)
endif()
