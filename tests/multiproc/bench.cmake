# pdcoll-bench smoke runs: small sweeps with checking (-c 1) through
# tools/pdcoll-run, so the sanitizer builds cover the benchmark's setup,
# every collective's buffer layout and the reference check. The benchmark
# itself is bench/pdcoll_bench.cpp (bench/bench.cmake); the test presets turn
# PDCOLL_BUILD_BENCH off, so the target is declared here when missing.
find_package(CLI11 QUIET)
if(CLI11_FOUND)
  if(NOT TARGET pdcoll-bench)
    add_executable(pdcoll-bench ${PROJECT_SOURCE_DIR}/bench/pdcoll_bench.cpp)
    target_link_libraries(pdcoll-bench PRIVATE pdcoll::pdcoll CLI11::CLI11)
    target_include_directories(pdcoll-bench PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/bench)
  endif()
  set(PDCOLL_BENCH_SMOKE
    "all_reduce_float_shm|3|--transport shm -b 8 -e 1M -f 32"
    "all_reduce_shareable_shm|3|--transport shm --domain host_shareable -b 8 -e 4M -f 8"
    "all_reduce_settle_uring|3|--transport uring --settle 0.2 -b 8 -e 64K -f 64"
    "all_reduce_ring_int32_avg_tcp|2|--transport tcp --algo ring -d int32 -o avg -b 8 -e 256K -f 64"
    "all_reduce_direct_device_shm|3|--transport shm --algo direct --domain emulated_device -b 1M -e 8M -f 2"
    "reduce_scatter_bfloat16_uring_device|3|--transport uring --collective reduce_scatter -d bfloat16 --domain emulated_device -b 96 -e 96K -f 32"
    "broadcast_half_shm_root1|3|--transport shm --collective broadcast -d half -r 1 -b 8 -e 64K -f 64"
    "reduce_prod_double_shm|3|--transport shm --collective reduce -d double -o prod -r 2 -b 8 -e 64K -f 64"
    "all_gather_shm|3|--transport shm --collective all_gather -b 12 -e 96K -f 64"
    "all_to_all_tcp|2|--transport tcp --collective all_to_all -d uint8 -b 8 -e 64K -f 64"
    "sendrecv_shm|3|--transport shm --collective sendrecv -d int64 -b 8 -e 64K -f 64")
  foreach(entry IN LISTS PDCOLL_BENCH_SMOKE)
    string(REPLACE "|" ";" parts "${entry}")
    list(GET parts 0 what)
    list(GET parts 1 ranks)
    list(GET parts 2 args)
    separate_arguments(args UNIX_COMMAND "${args}")
    add_test(NAME multiproc.bench.${what}
             COMMAND ${PDCOLL_RUN} -n ${ranks} --timeout 100 $<TARGET_FILE:pdcoll-bench> ${args} -n 2 -w 1 -c 1)
    set_tests_properties(multiproc.bench.${what} PROPERTIES LABELS "multiproc;bench" TIMEOUT 120
                         PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
  endforeach()
  # The TCP latency floor (bench/tcp_latency_floor.cpp) on 3 ranks, so its
  # fold for a world that is not a power of two runs under the sanitizers
  # too, with each wait, some per-step work and a settling run first; its
  # sums are checked on every rank.
  if(NOT TARGET tcp_latency_floor)
    add_executable(tcp_latency_floor ${PROJECT_SOURCE_DIR}/bench/tcp_latency_floor.cpp)
    target_link_libraries(tcp_latency_floor PRIVATE pdcoll::pdcoll CLI11::CLI11)
    target_include_directories(tcp_latency_floor PRIVATE ${PROJECT_SOURCE_DIR}/bench)
  endif()
  foreach(wait IN ITEMS poll block spin)
    add_test(NAME multiproc.bench.tcp_latency_floor_${wait}
             COMMAND ${PDCOLL_RUN} -n 3 --timeout 100 $<TARGET_FILE:tcp_latency_floor> --wait ${wait}
                     -b 4 -e 64K -f 16 -n 5 -w 1 --step-work-ns 200 --settle 0.1)
    set_tests_properties(multiproc.bench.tcp_latency_floor_${wait} PROPERTIES LABELS "multiproc;bench" TIMEOUT 120
                         PASS_REGULAR_EXPRESSION "Out of bounds values : 0 OK")
  endforeach()
  # The shared-memory latency floor (bench/shm_latency_floor.cpp) spinning
  # on 2 ranks and yielding on 5 (more than this machine's CPUs); each rank
  # checks its sums and the exit status says whether all did.
  if(NOT TARGET shm_latency_floor)
    add_executable(shm_latency_floor ${PROJECT_SOURCE_DIR}/bench/shm_latency_floor.cpp)
    target_link_libraries(shm_latency_floor PRIVATE pdcoll::pdcoll CLI11::CLI11)
  endif()
  foreach(ranks IN ITEMS 2 5)
    add_test(NAME multiproc.bench.shm_latency_floor_${ranks}
             COMMAND $<TARGET_FILE:shm_latency_floor> --ranks ${ranks} -b 12 -n 2000 --rounds 2)
    set_tests_properties(multiproc.bench.shm_latency_floor_${ranks} PROPERTIES LABELS "multiproc;bench" TIMEOUT 60)
  endforeach()
  # A bad command line is refused before joining (exit status 2).
  add_test(NAME multiproc.bench.rejects_an_algorithm_of_another_collective
           COMMAND $<TARGET_FILE:pdcoll-bench> --collective all_reduce --algo chain)
  set_tests_properties(multiproc.bench.rejects_an_algorithm_of_another_collective PROPERTIES
                       LABELS "multiproc;bench" TIMEOUT 30 WILL_FAIL TRUE)
else()
  message(STATUS "pdcoll: CLI11 not found; the pdcoll-bench smoke tests are skipped")
endif()
