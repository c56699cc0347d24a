# All-reduce sweep per algorithm (bench/allreduce_sweep.cpp): the measurements
# model/cost_model.hpp is fitted from. Run it through tools/pdcoll-run; build
# it optimised (cmake -DCMAKE_BUILD_TYPE=Release).
add_executable(allreduce_sweep ${CMAKE_CURRENT_LIST_DIR}/allreduce_sweep.cpp)
target_link_libraries(allreduce_sweep PRIVATE pdcoll::pdcoll)
