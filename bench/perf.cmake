# All-reduce sweep per algorithm (bench/allreduce_sweep.cpp): the measurements
# model/cost_model.hpp is fitted from. Run it through tools/pdcoll-run; build
# it optimised (cmake -DCMAKE_BUILD_TYPE=Release).
add_executable(allreduce_sweep ${CMAKE_CURRENT_LIST_DIR}/allreduce_sweep.cpp)
target_link_libraries(allreduce_sweep PRIVATE pdcoll::pdcoll)

# The cost of handing a CPU between two processes (bench/yield_handoff.cpp):
# the floor under all-reduce latency when ranks outnumber CPUs.
find_package(CLI11 QUIET)
if(CLI11_FOUND)
  add_executable(yield_handoff ${CMAKE_CURRENT_LIST_DIR}/yield_handoff.cpp)
  target_link_libraries(yield_handoff PRIVATE CLI11::CLI11)
endif()

# The time job::split takes to make two groups (bench/group_setup.cpp).
add_executable(group_setup ${CMAKE_CURRENT_LIST_DIR}/group_setup.cpp)
target_link_libraries(group_setup PRIVATE pdcoll::pdcoll)
