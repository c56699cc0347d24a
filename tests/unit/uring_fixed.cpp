// Tests of the uring_tcp endpoint's registered (fixed) buffers: zero-copy
// sends from a registered range go out as IORING_OP_SEND_ZC with
// IORING_RECVSEND_FIXED_BUF, everything else falls back to the plain paths,
// and the data is the same either way. Every rank runs in this process.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>

#include "unit/uring_support.hpp"

using namespace uring_test;
using pdcoll::transport::memory_kind;
using pdcoll::transport::memory_region;
using pdcoll::transport::registration_handle;
namespace uring = pdcoll::transport::uring_tcp;

namespace {

uring::options zero_copy_options(std::size_t threshold = 4096) {
  uring::options o;
  o.bind_address = "127.0.0.1";
  o.zero_copy_threshold = threshold;
  return o;
}

memory_region host_region(void* address, std::size_t length) {
  memory_region r;
  r.address = address;
  r.length = length;
  return r;
}

/// Sends `data` (length bytes) from rank 0 to rank 1 with `descriptor`;
/// returns what arrived.
std::vector<unsigned char> one_transfer(const std::vector<endpoint*>& eps, const void* data, std::size_t length,
                                        void* descriptor, std::uint64_t tag) {
  std::vector<unsigned char> into(length);
  recorder s, r;
  REQUIRE_FALSE(eps[1]->post_recv(0, into.data(), length, tag, 0, nullptr, &r));
  REQUIRE_FALSE(eps[0]->post_send(1, data, length, tag, descriptor, &s));
  REQUIRE(drive(eps, [&] { return s.done() && r.done(); }));
  CHECK_FALSE(s.result->error);
  CHECK_FALSE(r.result->error);
  CHECK(r.result->bytes == length);
  CHECK(s.calls == 1);
  CHECK(r.calls == 1);
  return into;
}

/// Whether every recorder in `ops` has its completion.
bool all_done(const std::deque<recorder>& ops) {
  for (const auto& r : ops)
    if (!r.done()) return false;
  return true;
}

/// Two connected ranks with the given options; `usable` is false (and says
/// so) where the kernel has no IORING_OP_SEND_ZC, so nothing can be tested.
struct fixed_pair {
  std::vector<std::unique_ptr<endpoint>> world;
  std::vector<endpoint*> eps;
  bool usable = false;
  explicit fixed_pair(const uring::options& o) : world(make_world(2, o)), eps(raw(world)) {
    usable = as_tcp(*eps[0]).fixed_buffers_enabled();
    if (!usable) MESSAGE("this kernel has no IORING_OP_SEND_ZC: nothing to test");
  }
};

}  // namespace

TEST_CASE("sends from a registered buffer use SEND_ZC with the fixed buffer and deliver intact data") {
  fixed_pair pair(zero_copy_options());
  if (!pair.usable) return;
  auto& eps = pair.eps;
  auto& tcp = as_tcp(*eps[0]);
  const std::size_t size = std::size_t{8} << 20;
  auto data = pattern(size, 21);
  registration_handle handle;
  REQUIRE_FALSE(eps[0]->register_region(host_region(data.data(), size), handle));
  REQUIRE(handle.descriptor != nullptr);
  CHECK(tcp.fixed_buffers_registered() == 1);
  CHECK(tcp.fixed_bytes_pinned() == size);
  CHECK(tcp.stats().fixed_registrations == 1);

  // The whole buffer, with and without the descriptor; a slice in the middle
  // (found by address); a payload just above the zero-copy threshold.
  CHECK(one_transfer(eps, data.data(), size, handle.descriptor, 1) == data);
  CHECK(tcp.stats().fixed_buffer_submissions >= 1);
  const auto after_first = tcp.stats().fixed_buffer_submissions;
  CHECK(one_transfer(eps, data.data(), size, nullptr, 2) == data);
  CHECK(tcp.stats().fixed_buffer_submissions > after_first);
  const std::size_t offset = 12345, slice = std::size_t{1} << 20;
  auto got = one_transfer(eps, data.data() + offset, slice, handle.descriptor, 3);
  CHECK(std::memcmp(got.data(), data.data() + offset, slice) == 0);
  got = one_transfer(eps, data.data() + size - 5000, 5000, nullptr, 4);
  CHECK(std::memcmp(got.data(), data.data() + size - 5000, 5000) == 0);
  CHECK(tcp.stats().fixed_buffer_submissions >= 4);

  // The kernel read the registered pages, not a copy made at registration.
  std::memset(data.data(), 0x5a, 4096);
  got = one_transfer(eps, data.data(), 4096, handle.descriptor, 5);
  CHECK(got == std::vector<unsigned char>(4096, 0x5a));

  eps[0]->deregister(handle);
  CHECK(handle.descriptor == nullptr);
  CHECK(tcp.fixed_buffers_registered() == 0);
  CHECK(tcp.fixed_bytes_pinned() == 0);
}

TEST_CASE("sends outside every registered buffer, or below the zero-copy threshold, take the plain paths") {
  fixed_pair pair(zero_copy_options(64 << 10));
  if (!pair.usable) return;
  auto& eps = pair.eps;
  auto& tcp = as_tcp(*eps[0]);
  // Only the first half of `whole` is registered.
  auto whole = pattern(2 << 20, 22);
  std::vector<unsigned char> registered(whole.begin(), whole.begin() + (1 << 20));
  auto unregistered = pattern(1 << 20, 23);
  registration_handle handle;
  REQUIRE_FALSE(eps[0]->register_region(host_region(whole.data(), 1 << 20), handle));
  REQUIRE(handle.descriptor != nullptr);

  // Not registered: plain SENDMSG_ZC, even with a descriptor of another range.
  auto zero_copy_before = tcp.stats().zero_copy_submissions;
  CHECK(one_transfer(eps, unregistered.data(), unregistered.size(), handle.descriptor, 1) == unregistered);
  CHECK(tcp.stats().fixed_buffer_submissions == 0);
  CHECK(tcp.stats().zero_copy_submissions > zero_copy_before);
  // Straddling the end of the registered half: not inside it.
  const std::size_t from = (1 << 20) - 100, span = 100 + (64 << 10);
  auto got = one_transfer(eps, whole.data() + from, span, handle.descriptor, 2);
  CHECK(std::memcmp(got.data(), whole.data() + from, span) == 0);
  CHECK(tcp.stats().fixed_buffer_submissions == 0);
  // Registered but below the zero-copy threshold: copied with sendmsg.
  got = one_transfer(eps, whole.data(), 1000, handle.descriptor, 3);
  CHECK(std::memcmp(got.data(), whole.data(), 1000) == 0);
  CHECK(tcp.stats().fixed_buffer_submissions == 0);
  // Registered and large enough: fixed.
  CHECK(one_transfer(eps, whole.data(), registered.size(), handle.descriptor, 4) == registered);
  CHECK(tcp.stats().fixed_buffer_submissions == 1);
  eps[0]->deregister(handle);
  // Deregistered: the same range goes back to plain zero copy.
  CHECK(one_transfer(eps, whole.data(), registered.size(), nullptr, 5) == registered);
  CHECK(tcp.stats().fixed_buffer_submissions == 1);
}

TEST_CASE("registration refuses what it cannot pin and hands back an empty handle, never an error") {
  SUBCASE("zero copy off") {
    auto world = make_world(1);
    auto& tcp = as_tcp(*world[0]);
    std::vector<unsigned char> buffer(1 << 16);
    registration_handle handle;
    CHECK_FALSE(tcp.fixed_buffers_enabled());
    CHECK_FALSE(tcp.register_region(host_region(buffer.data(), buffer.size()), handle));
    CHECK(handle.descriptor == nullptr);
    CHECK(tcp.stats().fixed_refusals == 1);
    tcp.deregister(handle);
  }
  SUBCASE("device memory, no slots, over the byte limit, table full") {
    auto o = zero_copy_options();
    o.fixed_buffer_slots = 2;
    o.fixed_buffer_bytes = 3 << 16;
    auto world = make_world(1, o);
    auto& tcp = as_tcp(*world[0]);
    if (!tcp.fixed_buffers_enabled()) {
      MESSAGE("this kernel has no IORING_OP_SEND_ZC: nothing to test");
      return;
    }
    std::vector<unsigned char> a(1 << 16), b(1 << 16), c(1 << 16), big(1 << 18);
    registration_handle device, too_big, ha, hb, hc;
    auto device_region = host_region(a.data(), a.size());
    device_region.kind = memory_kind::emulated_device;
    CHECK_FALSE(tcp.register_region(device_region, device));
    CHECK(device.descriptor == nullptr);
    CHECK_FALSE(tcp.register_region(host_region(big.data(), big.size()), too_big));
    CHECK(too_big.descriptor == nullptr);
    CHECK_FALSE(tcp.register_region(host_region(a.data(), a.size()), ha));
    CHECK_FALSE(tcp.register_region(host_region(b.data(), b.size()), hb));
    CHECK_FALSE(tcp.register_region(host_region(c.data(), c.size()), hc));
    CHECK(ha.descriptor != nullptr);
    CHECK(hb.descriptor != nullptr);
    CHECK(hc.descriptor == nullptr);  // two slots
    CHECK(tcp.stats().fixed_refusals == 3);
    CHECK(tcp.fixed_buffers_registered() == 2);
    // A freed slot is reused; a stale handle to it releases nothing.
    registration_handle stale = ha;
    tcp.deregister(ha);
    CHECK_FALSE(tcp.register_region(host_region(c.data(), c.size()), hc));
    CHECK(hc.descriptor != nullptr);
    tcp.deregister(stale);
    CHECK(tcp.fixed_buffers_registered() == 2);
    tcp.deregister(hb);
    tcp.deregister(hc);
    CHECK(tcp.fixed_buffers_registered() == 0);
  }
  SUBCASE("slots 0") {
    auto o = zero_copy_options();
    o.fixed_buffer_slots = 0;
    auto world = make_world(1, o);
    auto& tcp = as_tcp(*world[0]);
    std::vector<unsigned char> buffer(1 << 16);
    registration_handle handle;
    CHECK_FALSE(tcp.register_region(host_region(buffer.data(), buffer.size()), handle));
    CHECK(handle.descriptor == nullptr);
    CHECK(tcp.fixed_buffers_registered() == 0);
  }
}

TEST_CASE("a buffer deregistered while idle, unmapped and mapped again, is sent from its new pages") {
  fixed_pair pair(zero_copy_options());
  if (!pair.usable) return;
  auto& eps = pair.eps;
  auto& tcp = as_tcp(*eps[0]);
  const std::size_t size = std::size_t{1} << 20;
  void* first = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(first != MAP_FAILED);
  std::memset(first, 1, size);
  registration_handle handle;
  REQUIRE_FALSE(eps[0]->register_region(host_region(first, size), handle));
  REQUIRE(handle.descriptor != nullptr);
  CHECK(one_transfer(eps, first, size, handle.descriptor, 1) == std::vector<unsigned char>(size, 1));
  eps[0]->deregister(handle);
  REQUIRE(::munmap(first, size) == 0);
  // New pages at the same address: with the registration gone, nothing
  // may be sent from the old ones.
  void* second = ::mmap(first, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  REQUIRE(second == first);
  std::memset(second, 2, size);
  CHECK(one_transfer(eps, second, size, nullptr, 2) == std::vector<unsigned char>(size, 2));
  CHECK(tcp.stats().fixed_buffer_submissions == 1);
  ::munmap(second, size);
}

TEST_CASE("a buffer deregistered while a send from it waits behind a full socket is still sent whole") {
  // Rank 0's connection to "rank 1" is a loopback socket whose other end
  // this test reads itself, with small buffers so that it fills quickly.
  uring::detail::file_descriptor listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(listener.get(), 1) == 0);
  REQUIRE(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
  uring::detail::file_descriptor ours(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int small = 16384, one = 1;
  ::setsockopt(ours.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  REQUIRE(::connect(ours.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  uring::detail::file_descriptor theirs(::accept(listener.get(), nullptr, nullptr));
  REQUIRE(theirs.valid());
  ::setsockopt(theirs.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ::setsockopt(ours.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int socket_fd = ours.get();
  std::vector<uring::detail::file_descriptor> sockets(2);
  sockets[1] = std::move(ours);
  uring::options o = zero_copy_options();
  o.receiving = uring::receive_mode::single;
  uring::tcp_endpoint ep(0, 2, std::move(sockets), o);
  if (!ep.fixed_buffers_enabled()) {
    MESSAGE("this kernel has no IORING_OP_SEND_ZC: nothing to test");
    return;
  }
  auto data = pattern(std::size_t{1} << 20, 31);
  registration_handle handle;
  REQUIRE_FALSE(ep.register_region(host_region(data.data(), data.size()), handle));
  REQUIRE(ep.fixed_buffers_registered() == 1);

  // Filled from its descriptor, so that nothing of the endpoint's is in
  // flight: the send's header waits for room, its linked payload unissued.
  std::vector<unsigned char> filler(65536, 0x11);
  std::size_t filled = 0;
  for (ssize_t n; (n = ::send(socket_fd, filler.data(), filler.size(), MSG_DONTWAIT | MSG_NOSIGNAL)) > 0;)
    filled += static_cast<std::size_t>(n);
  recorder sent;
  REQUIRE_FALSE(ep.post_send(1, data.data(), data.size(), 7, handle.descriptor, &sent));
  for (int i = 0; i < 20; ++i) ep.progress();
  REQUIRE(ep.stats().fixed_buffer_submissions == 1);
  REQUIRE_FALSE(sent.done());
  ep.deregister(handle);
  CHECK(handle.descriptor == nullptr);

  // Read everything: the filler, the 16-byte header, the payload.
  const std::size_t header = 16, expected = filled + header + data.size();
  std::vector<unsigned char> stream;
  stream.reserve(expected);
  REQUIRE(::fcntl(theirs.get(), F_SETFL, ::fcntl(theirs.get(), F_GETFL) | O_NONBLOCK) == 0);
  std::vector<unsigned char> chunk(1 << 16);
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  while (clock_type::now() < deadline && !(sent.done() && stream.size() >= expected)) {
    const ssize_t n = ::recv(theirs.get(), chunk.data(), chunk.size(), 0);
    if (n == 0) break;  // the endpoint gave the connection up
    if (n > 0) stream.insert(stream.end(), chunk.begin(), chunk.begin() + n);
    ep.progress();
  }
  REQUIRE(sent.done());
  CHECK_FALSE(sent.result->error);
  REQUIRE(stream.size() == expected);
  CHECK(std::equal(data.begin(), data.end(), stream.begin() + static_cast<std::ptrdiff_t>(filled + header)));
  CHECK(ep.fixed_buffers_registered() == 0);  // emptied once the send was issued
  CHECK(ep.fixed_bytes_pinned() == 0);
}

TEST_CASE("hundreds of registered buffers carry interleaved zero-copy sends in order, both ways") {
  auto o = zero_copy_options();
  o.fixed_buffer_slots = 512;
  fixed_pair pair(o);
  if (!pair.usable) return;
  auto& eps = pair.eps;
  auto& tcp0 = as_tcp(*eps[0]);
  auto& tcp1 = as_tcp(*eps[1]);
  const int n = 300;
  const std::size_t size = 8192;
  std::vector<std::vector<unsigned char>> sources;
  std::vector<registration_handle> handles(2 * n);
  for (int i = 0; i < 2 * n; ++i) sources.push_back(pattern(size + static_cast<std::size_t>(i), 100 + i));
  for (int i = 0; i < 2 * n; ++i) {
    auto& ep = i < n ? *eps[0] : *eps[1];
    REQUIRE_FALSE(ep.register_region(host_region(sources[i].data(), sources[i].size()), handles[i]));
    REQUIRE(handles[i].descriptor != nullptr);
  }
  CHECK(tcp0.fixed_buffers_registered() == n);
  CHECK(tcp1.fixed_buffers_registered() == n);
  // Every message has the same tag, so only in-order delivery matches them
  // right; small sends between them must not overtake the linked pairs.
  std::deque<recorder> ops;
  std::vector<std::vector<unsigned char>> at1(n), at0(n);
  std::vector<int> small_at1(n), small_at0(n);
  std::vector<int> small_values(n);
  for (int i = 0; i < n; ++i) {
    small_values[i] = i;
    at1[i].resize(sources[i].size());
    at0[i].resize(sources[n + i].size());
    REQUIRE_FALSE(eps[1]->post_recv(0, at1[i].data(), at1[i].size(), 7, 0, nullptr, &ops.emplace_back()));
    REQUIRE_FALSE(eps[1]->post_recv(0, &small_at1[i], 4, 8, 0, nullptr, &ops.emplace_back()));
    REQUIRE_FALSE(eps[0]->post_recv(1, at0[i].data(), at0[i].size(), 7, 0, nullptr, &ops.emplace_back()));
    REQUIRE_FALSE(eps[0]->post_recv(1, &small_at0[i], 4, 8, 0, nullptr, &ops.emplace_back()));
  }
  for (int i = 0; i < n; ++i) {
    REQUIRE_FALSE(eps[0]->post_send(1, sources[i].data(), sources[i].size(), 7, handles[i].descriptor,
                                    &ops.emplace_back()));
    REQUIRE_FALSE(eps[0]->post_send(1, &small_values[i], 4, 8, nullptr, &ops.emplace_back()));
    REQUIRE_FALSE(eps[1]->post_send(0, sources[n + i].data(), sources[n + i].size(), 7, handles[n + i].descriptor,
                                    &ops.emplace_back()));
    REQUIRE_FALSE(eps[1]->post_send(0, &small_values[i], 4, 8, nullptr, &ops.emplace_back()));
  }
  REQUIRE(drive(eps, [&] { return all_done(ops); }));
  for (auto& r : ops) {
    CHECK(r.calls == 1);
    CHECK_FALSE(r.result->error);
  }
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(at1[i] == sources[i]);
    CHECK(at0[i] == sources[n + i]);
    CHECK(small_at1[i] == i);
    CHECK(small_at0[i] == i);
  }
  // Every large send went from its registered buffer: at least one fixed
  // submission each, and no zero-copy submission that was not fixed (a
  // send the kernel takes in part is submitted again for the rest, so
  // the count may exceed n).
  CHECK(tcp0.stats().fixed_buffer_submissions >= n);
  CHECK(tcp1.stats().fixed_buffer_submissions >= n);
  CHECK(tcp0.stats().zero_copy_submissions == tcp0.stats().fixed_buffer_submissions);
  CHECK(tcp1.stats().zero_copy_submissions == tcp1.stats().fixed_buffer_submissions);
  for (int i = 0; i < 2 * n; ++i) (i < n ? *eps[0] : *eps[1]).deregister(handles[i]);
  CHECK(tcp0.fixed_buffers_registered() == 0);
  CHECK(tcp1.fixed_buffers_registered() == 0);
}

TEST_CASE("cancelling fixed-buffer sends completes each once and keeps the stream usable") {
  fixed_pair pair(zero_copy_options());
  if (!pair.usable) return;
  auto& eps = pair.eps;
  const std::size_t size = std::size_t{4} << 20;
  auto data = pattern(size, 31);
  registration_handle handle;
  REQUIRE_FALSE(eps[0]->register_region(host_region(data.data(), size), handle));
  std::deque<recorder> sends(6);
  for (auto& s : sends) REQUIRE_FALSE(eps[0]->post_send(1, data.data(), size, 9, handle.descriptor, &s));
  eps[0]->progress();  // the first goes on the wire
  for (auto& s : sends) eps[0]->cancel(&s);
  for (int i = 0; i < 20; ++i) eps[0]->progress();
  // Receive whatever was not withdrawn; a send either arrives whole or not at all.
  std::size_t delivered_sends = 0;
  std::deque<recorder> recvs;
  std::vector<std::vector<unsigned char>> into;
  for (std::size_t i = 0; i < sends.size(); ++i) into.emplace_back(size);
  for (std::size_t i = 0; i < sends.size(); ++i)
    REQUIRE_FALSE(eps[1]->post_recv(0, into[i].data(), size, 9, 0, nullptr, &recvs.emplace_back()));
  REQUIRE(drive(eps, [&] { return all_done(sends); }));
  for (auto& s : sends) {
    CHECK(s.calls == 1);
    if (!s.result->error) ++delivered_sends;
    else CHECK(s.result->error == std::make_error_code(std::errc::operation_canceled));
  }
  CHECK(delivered_sends >= 1);
  REQUIRE(drive(eps, [&] {
    std::size_t done = 0;
    for (auto& r : recvs) done += r.done();
    return done == delivered_sends;
  }));
  for (std::size_t i = 0; i < delivered_sends; ++i) CHECK(into[i] == data);
  // The stream is still in step: one more message arrives intact.
  int value = 42, got = 0;
  recorder s, r;
  REQUIRE_FALSE(eps[1]->post_recv(0, &got, 4, 10, 0, nullptr, &r));
  REQUIRE_FALSE(eps[0]->post_send(1, &value, 4, 10, nullptr, &s));
  REQUIRE(drive(eps, [&] { return s.done() && r.done(); }));
  CHECK(got == 42);
  for (std::size_t i = delivered_sends; i < recvs.size(); ++i) eps[1]->cancel(&recvs[i]);
  REQUIRE(drive(eps, [&] { return all_done(recvs); }));
  eps[0]->deregister(handle);
}
