# uring_tcp transport: multi-process tests. The ranks are forked by
# tests/multiproc/fork_harness.hpp (the "store" case exchanges addresses
# through the bootstrap rendezvous store); each ctest entry runs one case.
pdcoll_multiproc_executable(uring_multiproc uring_transport.cpp)

set(PDCOLL_URING_CASES
  "pingpong|ping-pong from 0 bytes to 64 MiB*|120"
  "outstanding|four ranks keep hundreds of messages*|120"
  "matching|across processes: out-of-order tags*|60"
  "peer_killed|a peer killed with SIGKILL*|120"
  "store|the mesh builds through the bootstrap rendezvous store*|60"
  "bandwidth|bandwidth of 64 MiB transfers*|400")

# Each case (but the bandwidth report) runs three times: over one connection
# per pair, over one per direction (options::directional_connections, read
# from PDCOLL_URING_DIRECTIONAL by local_options()), and receiving with a
# recv at a time instead of a multishot recv (options::multishot_receive,
# PDCOLL_URING_MULTISHOT=0): data, matching, cancels and a killed peer's
# loss on each receive path and with the two directions on different sockets.
foreach(entry IN LISTS PDCOLL_URING_CASES)
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 what)
  list(GET parts 1 filter)
  list(GET parts 2 seconds)
  add_test(NAME multiproc.uring.${what} COMMAND uring_multiproc "--test-case=${filter}")
  set_tests_properties(multiproc.uring.${what} PROPERTIES LABELS "multiproc;uring" TIMEOUT ${seconds})
  if(NOT what STREQUAL "bandwidth")
    add_test(NAME multiproc.uring.directional.${what} COMMAND uring_multiproc "--test-case=${filter}")
    set_tests_properties(multiproc.uring.directional.${what} PROPERTIES
      ENVIRONMENT "PDCOLL_URING_DIRECTIONAL=1" LABELS "multiproc;uring" TIMEOUT ${seconds})
    add_test(NAME multiproc.uring.single_recv.${what} COMMAND uring_multiproc "--test-case=${filter}")
    set_tests_properties(multiproc.uring.single_recv.${what} PROPERTIES
      ENVIRONMENT "PDCOLL_URING_MULTISHOT=0" LABELS "multiproc;uring" TIMEOUT ${seconds})
  endif()
endforeach()

# At PDCOLL_DEBUG=INFO every endpoint logs its counters when it closes.
add_test(NAME multiproc.uring.statistics_logged COMMAND uring_multiproc "--test-case=ping-pong from 0 bytes to 64 MiB*")
set_tests_properties(multiproc.uring.statistics_logged PROPERTIES
  ENVIRONMENT "PDCOLL_DEBUG=INFO" LABELS "multiproc;uring" TIMEOUT 120
  PASS_REGULAR_EXPRESSION "uring_tcp statistics: [1-9][0-9]* messages sent in [1-9][0-9]* send submissions.*[1-9][0-9]* recv completions"
  FAIL_REGULAR_EXPRESSION "Status: FAILURE|ERROR:")
