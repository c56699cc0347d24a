# Peer Direct end to end: collectives on emulated_device memory across real
# processes (tools/pdcoll-run), over every data path: direct over libfabric
# shm and tcp, host-staged over io_uring, and host staging forced on shm.
# Staging chunks are 64 KiB here so a few hundred KiB already run a
# multi-chunk pipeline.
pdcoll_multiproc_executable(multiproc_peerdirect peerdirect_collectives.cpp)

set(PDCOLL_PEERDIRECT_RUNS
  "direct.shm|2|PDCOLL_TRANSPORT=libfabric,PDCOLL_PROVIDER=shm"
  "direct.shm|3|PDCOLL_TRANSPORT=libfabric,PDCOLL_PROVIDER=shm"
  "direct.tcp|2|PDCOLL_TRANSPORT=libfabric,PDCOLL_PROVIDER=tcp"
  "direct.shm.nocache|2|PDCOLL_TRANSPORT=libfabric,PDCOLL_PROVIDER=shm,PDCOLL_REGISTRATION_CACHE=0"
  "forced_staging.shm|3|PDCOLL_TRANSPORT=libfabric,PDCOLL_PROVIDER=shm,PDCOLL_FORCE_STAGING=1"
  "staged.uring|2|PDCOLL_TRANSPORT=uring"
  "staged.uring|3|PDCOLL_TRANSPORT=uring")
foreach(entry IN LISTS PDCOLL_PEERDIRECT_RUNS)
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 what)
  list(GET parts 1 ranks)
  list(GET parts 2 env)
  string(REPLACE "," ";" env "${env}")
  add_test(NAME multiproc.peerdirect.${what}.n${ranks}
           COMMAND ${PDCOLL_RUN} -n ${ranks} --timeout 120 $<TARGET_FILE:multiproc_peerdirect>)
  set_tests_properties(multiproc.peerdirect.${what}.n${ranks} PROPERTIES
    ENVIRONMENT "${env};PDCOLL_STAGING_CHUNK_BYTES=65536;PDCOLL_TIMEOUT_MS=60000"
    LABELS "multiproc;peerdirect"
    TIMEOUT 180)
endforeach()
