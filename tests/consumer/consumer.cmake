# Consumer builds: pdcoll used the three ways a runtime's build uses it —
# find_package(pdcoll CONFIG) against `cmake --install`'s prefix,
# add_subdirectory of the source tree, and pkg-config — each building
# tests/consumer/main.cpp (the README's example) and running it on 2 ranks.
# (driver/ holds the script: tests/CMakeLists.txt includes every consumer/*.cmake.)
# Each test installs/builds in its own folder under the build tree, so they
# run in parallel; the consumer is built without the tree's sanitizer flags.
set(PDCOLL_CONSUMER_MODES add_subdirectory)
if(PDCOLL_INSTALL)  # the other two consume `cmake --install`'s result
  list(PREPEND PDCOLL_CONSUMER_MODES find_package pkg_config)
endif()
foreach(mode IN LISTS PDCOLL_CONSUMER_MODES)
  add_test(NAME consumer.${mode}
           COMMAND ${CMAKE_COMMAND} -DMODE=${mode} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                   -DBINARY_DIR=${PROJECT_BINARY_DIR} -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer/${mode}
                   -DCXX=${CMAKE_CXX_COMPILER} -P ${CMAKE_CURRENT_LIST_DIR}/driver/run_consumer.cmake)
  set_tests_properties(consumer.${mode} PROPERTIES LABELS "consumer" TIMEOUT 600)
endforeach()
