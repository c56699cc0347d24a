# Examples run as tests: each runs its own PASS/FAIL check on several ranks
# through tools/pdcoll-run, with a small problem size. Only when the examples
# are built (the tsan preset turns them off).
if(PDCOLL_BUILD_EXAMPLES)
  # 4 ranks over libfabric (shm), 3 ranks (a batch that does not split evenly)
  # over the io_uring transport; 20 steps, global batch 48 (50: 16+17+17), buckets of 96 floats.
  add_test(NAME examples.data_parallel_training.n4
           COMMAND ${PDCOLL_RUN} -n 4 --timeout 120 $<TARGET_FILE:data_parallel_training> 20 48 96)
  add_test(NAME examples.data_parallel_training.uring.n3
           COMMAND ${PDCOLL_RUN} -n 3 --timeout 120 $<TARGET_FILE:data_parallel_training> 20 50 96)
  set_tests_properties(examples.data_parallel_training.uring.n3 PROPERTIES ENVIRONMENT "PDCOLL_TRANSPORT=uring")
  # PDCOLL_TIMEOUT_MS at its largest means no deadline: the join must not
  # make one of its own (now + timeout wrapped into the past, and the step
  # failed with buckets still reducing into the gradients).
  add_test(NAME examples.data_parallel_training.no_deadline.n2
           COMMAND ${PDCOLL_RUN} -n 2 --timeout 120 $<TARGET_FILE:data_parallel_training> 5 48 96)
  set_tests_properties(examples.data_parallel_training.no_deadline.n2 PROPERTIES ENVIRONMENT
                       "PDCOLL_TIMEOUT_MS=9223372036854775807")
  set_tests_properties(examples.data_parallel_training.n4 examples.data_parallel_training.uring.n3
                       examples.data_parallel_training.no_deadline.n2
                       PROPERTIES LABELS "multiproc;examples" TIMEOUT 180)
  # Peer Direct on the emulated device: direct and host-staged all-reduces,
  # each checked on every rank (the exit status says whether all were right).
  add_test(NAME examples.peer_direct.n2 COMMAND ${PDCOLL_RUN} -n 2 --timeout 120 $<TARGET_FILE:peer_direct>)
  set_tests_properties(examples.peer_direct.n2 PROPERTIES LABELS "multiproc;examples" TIMEOUT 180)
  # The demo (scripts/demo.sh): its all-reduces on ordinary and on shareable
  # buffers are checked, and a wrong element fails it.
  add_test(NAME examples.hello_allreduce.n3
           COMMAND ${PDCOLL_RUN} -n 3 --timeout 200 $<TARGET_FILE:hello_allreduce>)
  set_tests_properties(examples.hello_allreduce.n3 PROPERTIES LABELS "multiproc;examples" TIMEOUT 240)
  # Groups: 2 replicas x 2 shards over libfabric (shm), 2 x 3 over io_uring.
  add_test(NAME examples.hybrid_parallel.n4 COMMAND ${PDCOLL_RUN} -n 4 --timeout 120 $<TARGET_FILE:hybrid_parallel>)
  add_test(NAME examples.hybrid_parallel.uring.n6
           COMMAND ${PDCOLL_RUN} -n 6 --timeout 120 $<TARGET_FILE:hybrid_parallel> 3)
  set_tests_properties(examples.hybrid_parallel.uring.n6 PROPERTIES ENVIRONMENT "PDCOLL_TRANSPORT=uring")
  set_tests_properties(examples.hybrid_parallel.n4 examples.hybrid_parallel.uring.n6
                       PROPERTIES LABELS "multiproc;examples" TIMEOUT 180)
  # Mixture-of-experts dispatch and combine (all_to_allv): 4 ranks over
  # libfabric (shm), 5 over io_uring with 101 tokens of 24 floats.
  add_test(NAME examples.moe_dispatch.n4 COMMAND ${PDCOLL_RUN} -n 4 --timeout 120 $<TARGET_FILE:moe_dispatch>)
  add_test(NAME examples.moe_dispatch.uring.n5
           COMMAND ${PDCOLL_RUN} -n 5 --timeout 120 $<TARGET_FILE:moe_dispatch> 101 24)
  set_tests_properties(examples.moe_dispatch.uring.n5 PROPERTIES ENVIRONMENT "PDCOLL_TRANSPORT=uring")
  set_tests_properties(examples.moe_dispatch.n4 examples.moe_dispatch.uring.n5
                       PROPERTIES LABELS "multiproc;examples" TIMEOUT 180)
  # memory_domains on each transport: direct over libfabric, staged over io_uring.
  foreach(transport IN ITEMS shm tcp uring)
    add_test(NAME examples.memory_domains.${transport}
             COMMAND ${PDCOLL_RUN} -n 2 --timeout 120 $<TARGET_FILE:memory_domains>)
    if(transport STREQUAL "uring")
      set_tests_properties(examples.memory_domains.${transport} PROPERTIES ENVIRONMENT "PDCOLL_TRANSPORT=uring")
    else()
      set_tests_properties(examples.memory_domains.${transport} PROPERTIES ENVIRONMENT "PDCOLL_PROVIDER=${transport}")
    endif()
    set_tests_properties(examples.memory_domains.${transport} PROPERTIES LABELS "multiproc;examples" TIMEOUT 180)
  endforeach()
endif()
