// Unit tests: the sender pipeline allocates nothing. Replaces the global
// operator new/delete for the whole test_exec binary, but counts only on a
// thread inside an allocation_counter scope.
#include <doctest/doctest.h>

#include "pdcoll/exec/exec.hpp"
#include "unit/allocation_counter.hpp"
#include "unit/exec_support.hpp"

namespace ex = pdcoll::exec;
namespace test = pdcoll::exec::test;

TEST_SUITE("exec.alloc") {

TEST_CASE("the allocation counter sees an allocation made inside its scope") {
  allocation_counter counter;
  int* volatile p = new int(1);  // volatile: the compiler may not elide the pair
  delete p;
  CHECK(counter.count() == 1);
}

TEST_CASE("just | then | then connected and started allocates nothing") {
  test::record rec;
  allocation_counter counter;
  {
    auto op = ex::connect(ex::just(1) | ex::then([](int x) { return x + 1; }) | ex::then([](int x) { return x * 10; }),
                          test::recording_receiver{&rec});
    ex::start(op);
  }
  CHECK(counter.count() == 0);
  CHECK(rec.value == 20);
}

TEST_CASE("when_all, let_value, upon_error and sync_wait allocate nothing") {
  allocation_counter counter;
  auto [v] = *ex::sync_wait(ex::when_all(ex::just(1), ex::just(2)) |
                            ex::let_value([](int& a, int& b) { return ex::just(a + b); }) |
                            ex::upon_error([](std::exception_ptr) { return 0; }));
  CHECK(counter.count() == 0);
  CHECK(v == 3);
}

TEST_CASE("a stop callback and a request_stop allocate nothing") {
  allocation_counter counter;
  ex::inplace_stop_source source;
  int runs = 0;
  {
    ex::inplace_stop_callback cb{source.get_token(), [&]() noexcept { ++runs; }};
    source.request_stop();
  }
  CHECK(counter.count() == 0);
  CHECK(runs == 1);
}

}  // TEST_SUITE
