# Bootstrap multi-process tests: the rendezvous store across real processes
# started by tools/pdcoll-run, and pdcoll-run's own behaviour.
pdcoll_multiproc_executable(multiproc_bootstrap bootstrap_rendezvous.cpp)
foreach(n IN ITEMS 1 2 3 5)
  add_test(NAME multiproc.bootstrap.n${n}
           COMMAND ${PDCOLL_RUN} -n ${n} --timeout 60 $<TARGET_FILE:multiproc_bootstrap>)
  set_tests_properties(multiproc.bootstrap.n${n} PROPERTIES LABELS "multiproc;bootstrap;tsan" TIMEOUT 90)
endforeach()

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME multiproc.bootstrap.pdcoll_run
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/bootstrap_pdcoll_run.py ${PDCOLL_RUN})
  set_tests_properties(multiproc.bootstrap.pdcoll_run PROPERTIES LABELS "multiproc;bootstrap" TIMEOUT 120)
endif()

# The bootstrap unit tests run a server thread beside client threads, so the
# ThreadSanitizer preset (which selects the "tsan" label) runs them too.
if(TEST unit.bootstrap)
  set_tests_properties(unit.bootstrap PROPERTIES LABELS "unit;bootstrap;tsan")
endif()
