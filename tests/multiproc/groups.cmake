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


# A group that outlives its job: 3 ranks over shm and io_uring.
pdcoll_multiproc_executable(multiproc_groups_outlive groups_outlive.cpp)
foreach(entry IN ITEMS "shm|libfabric|shm" "uring|uring|")
  pdcoll_transport_entry("${entry}" run)
  add_test(NAME multiproc.groups_outlive.${run_name}.n3
           COMMAND ${PDCOLL_RUN} -n 3 --timeout 100 $<TARGET_FILE:multiproc_groups_outlive>)
  set_tests_properties(multiproc.groups_outlive.${run_name}.n3 PROPERTIES
    ENVIRONMENT "${run_environment};PDCOLL_TIMEOUT_MS=30000" LABELS "multiproc;groups" TIMEOUT 120)
endforeach()

# A late member and a failed job communicator: 3 ranks over shm and io_uring,
# a short deadline (the late member sleeps 1.3 of it).
pdcoll_multiproc_executable(multiproc_groups_late groups_late.cpp)
foreach(entry IN ITEMS "shm|libfabric|shm" "uring|uring|")
  pdcoll_transport_entry("${entry}" run)
  add_test(NAME multiproc.groups_late.${run_name}.n3
           COMMAND ${PDCOLL_RUN} -n 3 --timeout 100 $<TARGET_FILE:multiproc_groups_late>)
  set_tests_properties(multiproc.groups_late.${run_name}.n3 PROPERTIES
    ENVIRONMENT "${run_environment};PDCOLL_TIMEOUT_MS=5000" LABELS "multiproc;groups" TIMEOUT 120)
endforeach()
