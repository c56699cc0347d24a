# pdcoll started by a real Open MPI mpirun (tests/mpirun/run.sh): pdcoll-bench's
# checked sweeps on 1-4 ranks with rank 0's address handed over through
# mpirun's PMIx server (no PDCOLL_ROOT), two jobs at once, and a rank that
# never joins. Registered where pdcoll is built with PMIx; skipped without
# mpirun (scripts/install-deps.sh --mpi).
if(TARGET pdcoll-bench AND PDCOLL_USES_PMIX)
  add_test(NAME mpirun.pmix COMMAND ${PROJECT_SOURCE_DIR}/tests/mpirun/run.sh $<TARGET_FILE:pdcoll-bench>)
  set_tests_properties(mpirun.pmix PROPERTIES LABELS "multiproc;mpirun" TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
