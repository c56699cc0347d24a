# libfabric transport: multi-process tests over shm and tcp (tcp;ofi_rxm).
# The ranks are forked by tests/multiproc/fork_harness.hpp; each ctest entry
# runs one doctest case with PDCOLL_PROVIDER set.
pdcoll_multiproc_executable(fabric_multiproc fabric_transport.cpp)

set(PDCOLL_FABRIC_CASES
  "pingpong|ping-pong from 0 bytes*"
  "outstanding|512 sends and 512 receives*"
  "tag_order|receives posted in reverse tag order*"
  "any_peer|any_peer receives with an ignore mask*"
  "cancel_truncate|truncation is collective_mismatch*"
  "rendezvous|large messages take the single-copy rendezvous*"
  "one_way_cma|with one-way CMA the readable direction*"
  "mixed_cma|with mixed readability every large message arrives*"
  "doorbell|an idle shm rank sleeps on its doorbell*"
  "eagain|sends beyond the provider's queue are queued*"
  "peer_killed|a receive from a peer killed*"
  "latency|8-byte ping-pong latency*")
foreach(provider shm tcp)
  foreach(entry IN LISTS PDCOLL_FABRIC_CASES)
    string(REPLACE "|" ";" parts "${entry}")
    list(GET parts 0 what)
    list(GET parts 1 filter)
    add_test(NAME multiproc.fabric.${what}.${provider}
             COMMAND fabric_multiproc "--test-case=${filter}")
    set_tests_properties(multiproc.fabric.${what}.${provider} PROPERTIES
      ENVIRONMENT "PDCOLL_PROVIDER=${provider}"
      LABELS "multiproc;fabric"
      TIMEOUT 180)
  endforeach()
endforeach()
