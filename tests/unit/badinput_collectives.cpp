// Bad input: every rejected call completes with its own errc and posts nothing.
#include <doctest/doctest.h>

#include <pdcoll/memory/emulated_device.hpp>
#include <pdcoll/pdcoll.hpp>
#include <unit/failure_endpoints.hpp>

#include <limits>
#include <system_error>
#include <vector>

namespace {

template <class S>
std::error_code outcome(S&& sender) {
  try {
    pdcoll::exec::sync_wait(std::forward<S>(sender));
  } catch (const std::system_error& e) {
    return e.code();
  }
  return {};
}

// A 3-rank world over counting endpoints; the checks run on rank 0 alone
// (rejected calls must not need the peers).
struct bad_input_world {
  pdcoll::testing::wrapped_world world{3, [](int) {
                                          pdcoll::testing::endpoint_faults f;
                                          f.unreachable = pdcoll::transport::memory_kind::emulated_device;
                                          return f;
                                        }};
  pdcoll::communicator& comm = *world.comms[0];
  int posts() const { return world.counters[0]->data_posts(); }
};

}  // namespace

TEST_CASE("a null buffer with a non-zero count is null_buffer and posts nothing") {
  bad_input_world w;
  pdcoll::view<float, pdcoll::memory::host> null_view(nullptr, 8);
  std::vector<float> out(8);
  CHECK(outcome(pdcoll::all_reduce(w.comm, null_view, out)) == pdcoll::errc::null_buffer);
  CHECK(outcome(pdcoll::all_gather(w.comm, null_view, out)) == pdcoll::errc::null_buffer);
  CHECK(w.posts() == 0);
  CHECK_FALSE(w.comm.aborted());
}

TEST_CASE("an undersized output is buffer_too_small and posts nothing") {
  bad_input_world w;
  std::vector<float> in(8), out(4), gathered(8 * 3 - 1), block(8);
  CHECK(outcome(pdcoll::all_reduce(w.comm, in, out)) == pdcoll::errc::buffer_too_small);
  CHECK(outcome(pdcoll::all_gather(w.comm, block, gathered)) == pdcoll::errc::buffer_too_small);
  std::vector<float> scatter_in(8 * 3 - 1), scatter_out(8);
  CHECK(outcome(pdcoll::reduce_scatter(w.comm, scatter_in, scatter_out)) == pdcoll::errc::buffer_too_small);
  CHECK(w.posts() == 0);
}

TEST_CASE("a count whose byte size overflows is count_overflow and posts nothing") {
  bad_input_world w;
  double cell = 0;
  // A view that claims more elements than size_t bytes can hold; never dereferenced.
  pdcoll::view<double, pdcoll::memory::host> huge(&cell, std::numeric_limits<std::size_t>::max() / 4);
  CHECK(outcome(pdcoll::all_reduce(w.comm, huge, huge)) == pdcoll::errc::count_overflow);
  // all_gather multiplies by the world size: fits per rank, overflows in total.
  pdcoll::view<double, pdcoll::memory::host> third(&cell, std::numeric_limits<std::size_t>::max() / 8 / 2);
  CHECK(outcome(pdcoll::all_gather(w.comm, third, huge)) == pdcoll::errc::count_overflow);
  // Point-to-point too: (2^61 + 1) doubles wrapped to 8 bytes, sent as a success.
  pdcoll::view<double, pdcoll::memory::host> wraps(&cell, (std::size_t{1} << 61) + 1);
  CHECK(outcome(pdcoll::send(w.comm, 1, wraps, 3)) == pdcoll::errc::count_overflow);
  CHECK(outcome(pdcoll::recv(w.comm, 1, wraps, 3)) == pdcoll::errc::count_overflow);
  CHECK(w.posts() == 0);
}

TEST_CASE("a root outside the world is root_out_of_range and posts nothing") {
  bad_input_world w;
  std::vector<int> data(16, 1), out(16);
  CHECK(outcome(pdcoll::broadcast(w.comm, data, 3)) == pdcoll::errc::root_out_of_range);
  CHECK(outcome(pdcoll::broadcast(w.comm, data, -1)) == pdcoll::errc::root_out_of_range);
  CHECK(outcome(pdcoll::reduce(w.comm, data, out, pdcoll::op::sum, 7)) == pdcoll::errc::root_out_of_range);
  CHECK(w.posts() == 0);
}

TEST_CASE("a run-time op the library cannot apply is unsupported_op and posts nothing") {
  bad_input_world w;
  std::vector<float> in(8, 1.0f), out(8);
  CHECK(outcome(pdcoll::all_reduce(w.comm, in, out, pdcoll::reduction::custom)) == pdcoll::errc::unsupported_op);
  CHECK(outcome(pdcoll::all_reduce(w.comm, in, out, static_cast<pdcoll::reduction>(200))) ==
        pdcoll::errc::unsupported_op);
  CHECK(w.posts() == 0);
}

TEST_CASE("a device buffer the transport cannot reach is unreachable_domain and posts nothing") {
  bad_input_world w;
  pdcoll::memory::emulated_device device(std::size_t{1} << 20);
  auto buffer = device.allocate<float>(256);
  CHECK(w.comm.path_for(pdcoll::transport::memory_kind::emulated_device) == pdcoll::transport::data_path::unreachable);
  CHECK(outcome(pdcoll::all_reduce(w.comm, buffer.view(), buffer.view())) == pdcoll::errc::unreachable_domain);
  CHECK(w.posts() == 0);
}

TEST_CASE("overlapping input and output are overlapping_buffers and post nothing") {
  bad_input_world w;
  std::vector<float> data(64, 1.0f);
  pdcoll::view<float, pdcoll::memory::host> a(data.data(), 32), b(data.data() + 8, 32);
  CHECK(outcome(pdcoll::all_reduce(w.comm, a, b)) == pdcoll::errc::overlapping_buffers);
  // all_gather in place takes this rank's block of the output (rank 0: the
  // first), reduce_scatter in place gives this rank's block of the input;
  // any other block, or a view across blocks, is refused.
  using host_view = pdcoll::view<float, pdcoll::memory::host>;
  const host_view all(data.data(), 24);
  CHECK(outcome(pdcoll::all_gather(w.comm, host_view(data.data() + 8, 8), all)) == pdcoll::errc::overlapping_buffers);
  CHECK(outcome(pdcoll::all_gather(w.comm, host_view(data.data() + 4, 8), all)) == pdcoll::errc::overlapping_buffers);
  CHECK(outcome(pdcoll::reduce_scatter(w.comm, all, host_view(data.data() + 8, 8))) ==
        pdcoll::errc::overlapping_buffers);
  CHECK(outcome(pdcoll::reduce_scatter(w.comm, all, host_view(data.data() + 2, 8))) ==
        pdcoll::errc::overlapping_buffers);
  CHECK(outcome(pdcoll::all_to_all(w.comm, all, all)) == pdcoll::errc::overlapping_buffers);
  CHECK(w.posts() == 0);
}

TEST_CASE("all_to_allv and all_gatherv refuse bad blocks with their own errc and post nothing") {
  bad_input_world w;  // rank 0 of 3
  using sizes = std::vector<std::size_t>;
  using host_view = pdcoll::view<float, pdcoll::memory::host>;
  std::vector<float> in(16, 1.0f), out(16);
  const sizes counts{2, 2, 2}, displs{0, 2, 4};
  // Arrays of the wrong length.
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, sizes{2, 2}, out, counts)) == pdcoll::errc::invalid_argument);
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, counts, displs, out, counts, sizes{0, 2})) ==
        pdcoll::errc::invalid_argument);
  CHECK(outcome(pdcoll::all_gatherv(w.comm, host_view(in.data(), 2), out, sizes{2, 2, 2, 2})) ==
        pdcoll::errc::invalid_argument);
  // The block to itself differs from the block from itself.
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, sizes{3, 2, 2}, out, counts)) == pdcoll::errc::invalid_argument);
  // A block past its buffer, on either side; a null buffer with blocks in it.
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, counts, sizes{0, 2, 15}, out, counts, displs)) ==
        pdcoll::errc::buffer_too_small);
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, counts, displs, out, counts, sizes{0, 2, 15})) ==
        pdcoll::errc::buffer_too_small);
  CHECK(outcome(pdcoll::all_gatherv(w.comm, host_view(in.data(), 1), out, counts)) == pdcoll::errc::buffer_too_small);
  CHECK(outcome(pdcoll::all_to_allv(w.comm, host_view(nullptr, 16), counts, out, counts)) ==
        pdcoll::errc::null_buffer);
  // An end that overflows, in elements or in bytes.
  const std::size_t top = std::numeric_limits<std::size_t>::max();
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, counts, sizes{0, 2, top - 1}, out, counts, displs)) ==
        pdcoll::errc::count_overflow);
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, counts, displs, out, counts, sizes{0, 2, top / 2})) ==
        pdcoll::errc::count_overflow);
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, sizes{2, 2, top}, out, counts)) == pdcoll::errc::count_overflow);
  // Receive blocks that overlap each other; input and output that overlap.
  CHECK(outcome(pdcoll::all_to_allv(w.comm, in, counts, displs, out, counts, sizes{0, 1, 4})) ==
        pdcoll::errc::overlapping_buffers);
  CHECK(outcome(pdcoll::all_gatherv(w.comm, host_view(in.data(), 2), out, counts, sizes{4, 5, 0})) ==
        pdcoll::errc::overlapping_buffers);
  CHECK(outcome(pdcoll::all_to_allv(w.comm, host_view(out.data() + 2, 8), counts, out, counts)) ==
        pdcoll::errc::overlapping_buffers);
  // all_gatherv in place takes this rank's receive block only (rank 0: at
  // displacement 4 here), not another place in the output.
  CHECK(outcome(pdcoll::all_gatherv(w.comm, host_view(out.data() + 2, 2), out, counts, sizes{4, 0, 8})) ==
        pdcoll::errc::overlapping_buffers);
  CHECK(w.posts() == 0);
  CHECK_FALSE(w.comm.aborted());
}

TEST_CASE("a registration the transport refuses fails with the transport's error, not a generic one") {
  // Every rank's transport refuses to register with ENOMEM: the collective
  // and the send report ENOMEM (registration_failed hid the cause).
  pdcoll::testing::wrapped_world world{2, [](int) {
                                         pdcoll::testing::endpoint_faults f;
                                         f.refuse_registration = std::make_error_code(std::errc::not_enough_memory);
                                         return f;
                                       }};
  std::vector<float> data(1 << 16, 1.0f);  // past the small path, which copies instead of registering
  CHECK(outcome(pdcoll::all_reduce(*world.comms[0], data)) == std::errc::not_enough_memory);
  pdcoll::view<float, pdcoll::memory::host> block(data.data(), 16);
  CHECK(outcome(pdcoll::send(*world.comms[1], 0, block, 1)) == std::errc::not_enough_memory);
}

TEST_CASE("use after abort is aborted and posts nothing") {
  bad_input_world w;
  w.comm.abort();
  const int before = w.posts();
  std::vector<float> data(8, 1.0f);
  CHECK(outcome(pdcoll::all_reduce(w.comm, data)) == pdcoll::errc::aborted);
  CHECK(outcome(pdcoll::barrier(w.comm)) == pdcoll::errc::aborted);
  CHECK(outcome(pdcoll::broadcast(w.comm, data, 0)) == pdcoll::errc::aborted);
  CHECK(w.posts() == before);
}

TEST_CASE("bad input does not disturb the collectives that follow it") {
  pdcoll::testing::wrapped_world world(3, [](int) { return pdcoll::testing::endpoint_faults{}; });
  world.run([](int rank, pdcoll::communicator& comm) {
    std::vector<int> data(10, rank + 1), small(2);
    CHECK(outcome(pdcoll::all_reduce(comm, data, small)) == pdcoll::errc::buffer_too_small);
    CHECK(outcome(pdcoll::broadcast(comm, data, 9)) == pdcoll::errc::root_out_of_range);
    CHECK(outcome(pdcoll::all_reduce(comm, data)) == std::error_code{});
    for (int v : data) CHECK(v == 6);
  });
}
