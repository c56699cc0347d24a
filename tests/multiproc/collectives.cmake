# Collectives and point-to-point across processes: tests/multiproc/collectives_world.cpp
# runs through tools/pdcoll-run on 2, 3 and 4 ranks over each transport
# (libfabric shm, libfabric tcp, io_uring TCP); every rank checks its own
# results. The mismatch cases abort their communicator on purpose, so each
# runs in a job of its own per transport.
pdcoll_multiproc_executable(multiproc_collectives collectives_world.cpp)

# name|PDCOLL_TRANSPORT|PDCOLL_PROVIDER
set(PDCOLL_COLLECTIVES_TRANSPORTS "shm|libfabric|shm" "tcp|libfabric|tcp" "uring|uring|")
foreach(entry IN LISTS PDCOLL_COLLECTIVES_TRANSPORTS)
  # Deadlines well under the ctest timeout: a lost message fails the job, it never hangs it.
  pdcoll_transport_entry("${entry}" run)
  set(what ${run_name})
  set(environment "${run_environment}" "PDCOLL_TIMEOUT_MS=30000")
  foreach(n IN ITEMS 2 3 4)
    add_test(NAME multiproc.collectives.${what}.n${n}
             COMMAND ${PDCOLL_RUN} -n ${n} --timeout 280 $<TARGET_FILE:multiproc_collectives>
                     --test-case-exclude=mismatch*)
    # On shm, automatic's large blocks go as messages or through node memory
    # as the node's copy probe says: 2 ranks force the slots (where the
    # 2-rank paths differ most), 3 messages, 4 take what the probe finds, so
    # every machine runs both.
    set(bulk "")
    if(what STREQUAL "shm" AND n EQUAL 2)
      set(bulk "PDCOLL_NODE_BULK=slots")
    elseif(what STREQUAL "shm" AND n EQUAL 3)
      set(bulk "PDCOLL_NODE_BULK=messages")
    endif()
    set_tests_properties(multiproc.collectives.${what}.n${n} PROPERTIES
      ENVIRONMENT "${environment};${bulk}" LABELS "multiproc;collectives" TIMEOUT 300)
  endforeach()
  if(what STREQUAL "shm")
    # The shared-memory all-reduce on world sizes the full runs above leave out.
    foreach(n IN ITEMS 1 5 8)
      add_test(NAME multiproc.collectives.shm.shared_memory.n${n}
               COMMAND ${PDCOLL_RUN} -n ${n} --timeout 280 $<TARGET_FILE:multiproc_collectives>
                       --test-case=shared_memory*)
      set_tests_properties(multiproc.collectives.shm.shared_memory.n${n} PROPERTIES
        ENVIRONMENT "${environment}" LABELS "multiproc;collectives" TIMEOUT 300)
    endforeach()
  endif()
  # With the communicator's own progress thread (PDCOLL_PROGRESS_THREAD=1):
  # it alone drives every rank's operations, falling idle between them.
  add_test(NAME multiproc.collectives.${what}.progress_thread.n3
           COMMAND ${PDCOLL_RUN} -n 3 --timeout 280 $<TARGET_FILE:multiproc_collectives>
                   --test-case-exclude=mismatch*)
  set_tests_properties(multiproc.collectives.${what}.progress_thread.n3 PROPERTIES
    ENVIRONMENT "${environment};PDCOLL_PROGRESS_THREAD=1" LABELS "multiproc;collectives" TIMEOUT 300)
  add_test(NAME multiproc.collectives.${what}.mismatch
           COMMAND ${PDCOLL_RUN} -n 3 --timeout 100 $<TARGET_FILE:multiproc_collectives> --test-case=mismatch:*)
  set_tests_properties(multiproc.collectives.${what}.mismatch PROPERTIES
    ENVIRONMENT "${environment}" LABELS "multiproc;collectives" TIMEOUT 120)
  add_test(NAME multiproc.collectives.${what}.mismatch_v
           COMMAND ${PDCOLL_RUN} -n 3 --timeout 100 $<TARGET_FILE:multiproc_collectives> --test-case=mismatch_v:*)
  set_tests_properties(multiproc.collectives.${what}.mismatch_v PROPERTIES
    ENVIRONMENT "${environment}" LABELS "multiproc;collectives" TIMEOUT 120)
endforeach()

# The io_uring transport over one connection per direction (job.hpp's
# PDCOLL_URING_DIRECTIONAL): the same checks, 4 ranks.
add_test(NAME multiproc.collectives.uring_directional.n4
         COMMAND ${PDCOLL_RUN} -n 4 --timeout 280 $<TARGET_FILE:multiproc_collectives> --test-case-exclude=mismatch*)
set_tests_properties(multiproc.collectives.uring_directional.n4 PROPERTIES
  ENVIRONMENT "PDCOLL_TRANSPORT=uring;PDCOLL_URING_DIRECTIONAL=1;PDCOLL_TIMEOUT_MS=30000"
  LABELS "multiproc;collectives" TIMEOUT 300)

# The io_uring transport with zero-copy sends from 4 KiB (job.hpp's
# PDCOLL_URING_ZERO_COPY_BYTES): the same checks, 3 ranks.
add_test(NAME multiproc.collectives.uring_zero_copy.n3
         COMMAND ${PDCOLL_RUN} -n 3 --timeout 280 $<TARGET_FILE:multiproc_collectives> --test-case-exclude=mismatch*)
set_tests_properties(multiproc.collectives.uring_zero_copy.n3 PROPERTIES
  ENVIRONMENT "PDCOLL_TRANSPORT=uring;PDCOLL_URING_ZERO_COPY_BYTES=4096;PDCOLL_TIMEOUT_MS=30000"
  LABELS "multiproc;collectives" TIMEOUT 300)

# The io_uring transport's TCP congestion control (job.hpp's
# PDCOLL_URING_CONGESTION): the checks on 3 ranks with the system's choice
# instead of the loopback default's CUBIC, and a name the kernel lacks
# failing setup with an error that names it (each rank refuses it on its
# listener, before the address exchange: a rank whose peer failed first
# may end with the peer's loss instead, so one rank's line is asked for).
add_test(NAME multiproc.collectives.uring_system_congestion.n3
         COMMAND ${PDCOLL_RUN} -n 3 --timeout 280 $<TARGET_FILE:multiproc_collectives> --test-case-exclude=mismatch*)
set_tests_properties(multiproc.collectives.uring_system_congestion.n3 PROPERTIES
  ENVIRONMENT "PDCOLL_TRANSPORT=uring;PDCOLL_URING_CONGESTION=system;PDCOLL_TIMEOUT_MS=30000"
  LABELS "multiproc;collectives" TIMEOUT 300)
add_test(NAME multiproc.collectives.uring_congestion_refused
         COMMAND ${PDCOLL_RUN} -n 2 --timeout 60 $<TARGET_FILE:multiproc_collectives> --test-case=mismatch*)
set_tests_properties(multiproc.collectives.uring_congestion_refused PROPERTIES
  ENVIRONMENT "PDCOLL_TRANSPORT=uring;PDCOLL_URING_CONGESTION=no-such-cc;PDCOLL_TIMEOUT_MS=30000"
  PASS_REGULAR_EXPRESSION "\\[[01]\\][^\n]*congestion control 'no-such-cc' refused"
  LABELS "multiproc;collectives" TIMEOUT 90)
