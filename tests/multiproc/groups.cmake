# Groups (job::split, job::new_group): tests/multiproc/groups.cpp through
# tools/pdcoll-run on odd and even world sizes over each transport; every
# rank checks the group it got and the group's collectives.
pdcoll_multiproc_executable(multiproc_groups groups.cpp)

# name|PDCOLL_TRANSPORT|PDCOLL_PROVIDER|world sizes
set(PDCOLL_GROUPS_RUNS "shm|libfabric|shm|1 2 3 5 8" "tcp|libfabric|tcp|2 4" "uring|uring||3 4")
foreach(entry IN LISTS PDCOLL_GROUPS_RUNS)
  pdcoll_transport_entry("${entry}" run)
  list(APPEND run_environment "PDCOLL_TIMEOUT_MS=30000")  # well under ctest's timeout
  separate_arguments(run_extra)
  foreach(n IN LISTS run_extra)
    add_test(NAME multiproc.groups.${run_name}.n${n}
             COMMAND ${PDCOLL_RUN} -n ${n} --timeout 280 $<TARGET_FILE:multiproc_groups>)
    set_tests_properties(multiproc.groups.${run_name}.n${n} PROPERTIES
      ENVIRONMENT "${run_environment}" LABELS "multiproc;groups" TIMEOUT 300)
  endforeach()
endforeach()


# Two 3-rank programs over shm and io_uring, each under its own deadline: a
# group that outlives its job (30 s), and a late member and a failed job
# communicator (8 s: the late member sleeps 1.3 of it).
pdcoll_multiproc_executable(multiproc_groups_outlive groups_outlive.cpp)
pdcoll_multiproc_executable(multiproc_groups_late groups_late.cpp)
foreach(entry IN ITEMS "shm|libfabric|shm" "uring|uring|")
  pdcoll_transport_entry("${entry}" run)
  foreach(program IN ITEMS "outlive|30000" "late|8000")
    string(REPLACE "|" ";" parts "${program}")
    list(GET parts 0 what)
    list(GET parts 1 timeout_ms)
    add_test(NAME multiproc.groups_${what}.${run_name}.n3
             COMMAND ${PDCOLL_RUN} -n 3 --timeout 100 $<TARGET_FILE:multiproc_groups_${what}>)
    set_tests_properties(multiproc.groups_${what}.${run_name}.n3 PROPERTIES
      ENVIRONMENT "${run_environment};PDCOLL_TIMEOUT_MS=${timeout_ms}" LABELS "multiproc;groups" TIMEOUT 120)
  endforeach()
endforeach()
