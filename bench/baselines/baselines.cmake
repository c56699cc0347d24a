# Baselines for pdcoll-bench, built only when their library is installed
# (scripts/install-deps.sh --bench): Open MPI's MPI_Allreduce and Gloo's
# all-reduce algorithms, printing pdcoll-bench's columns (bench/bench_report.hpp).
# Open MPI's runtime without its development files (openmpi-bin, which
# install-deps.sh --mpi brings for mpirun, without libopenmpi-dev) has a
# compiler wrapper naming include directories that do not exist, and
# FindMPI then fails the whole configure instead of reporting MPI missing:
# ask the wrapper first.
set(PDCOLL_MPI_USABLE TRUE)
find_program(PDCOLL_MPICXX NAMES mpicxx)
if(PDCOLL_MPICXX)
  execute_process(COMMAND ${PDCOLL_MPICXX} --showme:incdirs OUTPUT_VARIABLE pdcoll_mpi_incdirs
                  RESULT_VARIABLE pdcoll_mpi_showme OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(pdcoll_mpi_showme EQUAL 0)  # Open MPI's wrapper; others answer no --showme
    separate_arguments(pdcoll_mpi_incdirs)
    foreach(dir IN LISTS pdcoll_mpi_incdirs)
      if(NOT IS_DIRECTORY "${dir}")
        set(PDCOLL_MPI_USABLE FALSE)
      endif()
    endforeach()
  endif()
endif()
if(PDCOLL_MPI_USABLE)
  find_package(MPI QUIET COMPONENTS CXX)
endif()
if(PDCOLL_MPI_USABLE AND MPI_CXX_FOUND)
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
