# Baselines for pdcoll-bench, built only when their library is installed
# (scripts/install-deps.sh --bench): Open MPI's MPI_Allreduce and Gloo's
# all-reduce algorithms, printing pdcoll-bench's columns (bench/bench_report.hpp).
find_package(MPI QUIET COMPONENTS CXX)
if(MPI_CXX_FOUND)
  add_executable(mpi_allreduce_bench ${CMAKE_CURRENT_LIST_DIR}/mpi_allreduce_bench.cpp)
  target_link_libraries(mpi_allreduce_bench PRIVATE MPI::MPI_CXX)
  target_compile_features(mpi_allreduce_bench PRIVATE cxx_std_20)
else()
  message(STATUS "pdcoll: MPI not found (libopenmpi-dev); mpi_allreduce_bench is not built")
endif()

find_path(PDCOLL_GLOO_INCLUDE gloo/allreduce.h)
find_library(PDCOLL_GLOO_LIBRARY gloo)
if(PDCOLL_GLOO_INCLUDE AND PDCOLL_GLOO_LIBRARY)
  add_executable(gloo_allreduce_bench ${CMAKE_CURRENT_LIST_DIR}/gloo_allreduce_bench.cpp)
  target_include_directories(gloo_allreduce_bench PRIVATE ${PDCOLL_GLOO_INCLUDE})
  target_link_libraries(gloo_allreduce_bench PRIVATE ${PDCOLL_GLOO_LIBRARY} Threads::Threads)
  target_compile_features(gloo_allreduce_bench PRIVATE cxx_std_20)
else()
  message(STATUS "pdcoll: Gloo not found (libgloo-dev); gloo_allreduce_bench is not built")
endif()
