# Peer Direct versus host staging (bench/peer_direct_bench.cpp): all-reduce
# bus bandwidth on emulated device memory, 64 KiB to 256 MiB, direct with and
# without the registration cache and host-staged, over one provider.
# A program, not a test: run it through tools/pdcoll-run from a Release build.
add_executable(peer_direct_bench ${CMAKE_CURRENT_LIST_DIR}/peer_direct_bench.cpp)
target_link_libraries(peer_direct_bench PRIVATE pdcoll::pdcoll)
