// Unit tests: one rank talking to itself through a real libfabric endpoint
// (shm and tcp;ofi_rxm), covering the transport contract in one process.
#include <doctest/doctest.h>

#include <sys/uio.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "multiproc/fork_harness.hpp"
#include "pdcoll/transport/libfabric/endpoint.hpp"

namespace fabric = pdcoll::transport::libfabric;
using pdcoll::test::drive_until;
using pdcoll::test::recorded_op;
using pdcoll::transport::memory_kind;

namespace {

std::unique_ptr<fabric::fabric_endpoint> open_self(const std::string& provider,
                                                   fabric::options opts = {}) {
  opts.provider = provider;
  auto self = [](std::string_view s) { return std::vector<std::string>{std::string(s)}; };
  return std::make_unique<fabric::fabric_endpoint>(0, 1, self, opts);
}

auto soon() { return std::chrono::steady_clock::now() + std::chrono::seconds(10); }

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
  return v;
}

const char* const providers[] = {"shm", "tcp"};

}  // namespace

TEST_CASE("a message to self arrives with its bytes, tag and peer over shm and tcp") {
  for (const char* provider : providers) {
    CAPTURE(provider);
    auto ep = open_self(provider);
    CHECK(ep->name().rfind("libfabric:", 0) == 0);
    for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20}) {
      CAPTURE(size);
      auto out = pattern(size, 7);
      std::vector<unsigned char> in(size + 1, 0);
      recorded_op send, recv;
      REQUIRE_FALSE(ep->post_recv(0, in.data(), in.size(), 42, 0, nullptr, &recv));
      REQUIRE_FALSE(ep->post_send(0, out.data(), size, 42, nullptr, &send));
      REQUIRE(drive_until(*ep, [&] { return send.done() && recv.done(); }, soon()));
      CHECK(send.completions == 1);
      CHECK(recv.completions == 1);
      CHECK_FALSE(recv.result.error);
      CHECK(recv.result.bytes == size);
      CHECK(send.result.bytes == size);
      CHECK(recv.result.tag == 42);
      CHECK(recv.result.peer == 0);
      CHECK(std::equal(out.begin(), out.end(), in.begin()));
    }
    // On shm the 1 MiB message took the rendezvous (it is above the inject
    // size, where the rank may read itself), and the rank answered itself in
    // its own doorbell's finish word.
    const bool by_word = std::string(provider) == "shm" && ep->rendezvous_with(0) && ep->has_doorbell();
    CHECK(ep->finish_words_collected() == (by_word ? 1 : 0));
  }
}

TEST_CASE("messages longer than the chunk size are split and reassembled exactly") {
  // With the rendezvous off every long message is split; with it on (shm),
  // those above the inject size take it instead, their notice landing in the
  // first chunk of a split receive.
  for (const char* provider : providers) {
    for (const bool rendezvous : {false, true}) {
      CAPTURE(provider);
      CAPTURE(rendezvous);
      fabric::options opts;
      opts.max_message_size = 4096;
      if (!rendezvous) opts.rendezvous_threshold = 0;
      auto ep = open_self(provider, opts);
      if (!rendezvous) CHECK_FALSE(ep->rendezvous_with(0));
      REQUIRE(ep->chunk_bytes() == 4096);
      for (std::size_t size : {4095u, 4096u, 4097u, 3u * 4096u, 100000u}) {
        CAPTURE(size);
        auto out = pattern(size, static_cast<unsigned>(size));
        // Two messages with the same tag back to back: their chunks must not mix.
        auto out2 = pattern(size, 99);
        std::vector<unsigned char> in(size + 8192, 0), in2(size + 8192, 0);
        recorded_op s1, s2, r1, r2;
        REQUIRE_FALSE(ep->post_recv(0, in.data(), in.size(), 5, 0, nullptr, &r1));
        REQUIRE_FALSE(ep->post_recv(0, in2.data(), in2.size(), 5, 0, nullptr, &r2));
        REQUIRE_FALSE(ep->post_send(0, out.data(), size, 5, nullptr, &s1));
        REQUIRE_FALSE(ep->post_send(0, out2.data(), size, 5, nullptr, &s2));
        REQUIRE(drive_until(*ep, [&] { return s1.done() && s2.done() && r1.done() && r2.done(); }, soon()));
        CHECK_FALSE(r1.result.error);
        CHECK_FALSE(r2.result.error);
        CHECK(r1.result.bytes == size);
        CHECK(r2.result.bytes == size);
        CHECK(r1.result.tag == 5);
        CHECK(s1.result.bytes == size);
        CHECK(std::equal(out.begin(), out.end(), in.begin()));
        CHECK(std::equal(out2.begin(), out2.end(), in2.begin()));
      }
      CHECK(ep->outstanding() == 0);
      // Both messages of 4097, 12288 and 100000 bytes went by rendezvous
      // where the rank reads itself, each answered in a finish word.
      const bool by_word = rendezvous && std::string(provider) == "shm" && ep->rendezvous_with(0) &&
                           ep->has_doorbell();
      CHECK(ep->finish_words_collected() == (by_word ? 6 : 0));
    }
  }
}

TEST_CASE("a message longer than the receive buffer completes with collective_mismatch") {
  for (const char* provider : providers) {
    CAPTURE(provider);
    for (std::size_t chunk : {std::size_t{0}, std::size_t{1024}}) {
      CAPTURE(chunk);
      fabric::options opts;
      opts.max_message_size = chunk;
      auto ep = open_self(provider, opts);
      auto out = pattern(3000, 1);
      std::vector<unsigned char> in(2000);
      recorded_op send, recv;
      REQUIRE_FALSE(ep->post_recv(0, in.data(), in.size(), 9, 0, nullptr, &recv));
      REQUIRE_FALSE(ep->post_send(0, out.data(), out.size(), 9, nullptr, &send));
      REQUIRE(drive_until(*ep, [&] { return recv.done(); }, soon()));
      CHECK(recv.completions == 1);
      CHECK(recv.result.error == pdcoll::errc::collective_mismatch);
      ep->cancel(&send);
      drive_until(*ep, [&] { return send.done(); }, soon());
    }
  }
}

TEST_CASE("a cancelled receive completes exactly once with operation_canceled") {
  for (const char* provider : providers) {
    CAPTURE(provider);
    auto ep = open_self(provider);
    std::vector<unsigned char> in(64);
    recorded_op recv;
    REQUIRE_FALSE(ep->post_recv(0, in.data(), in.size(), 3, 0, nullptr, &recv));
    ep->cancel(&recv);
    ep->cancel(&recv);  // a second request changes nothing
    REQUIRE(drive_until(*ep, [&] { return recv.done(); }, soon()));
    CHECK(recv.result.error == std::errc::operation_canceled);
    // Nothing further arrives for it, and cancelling a finished op is harmless.
    ep->cancel(&recv);
    drive_until(*ep, [] { return false; }, std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
    CHECK(recv.completions == 1);
    CHECK(ep->outstanding() == 0);
  }
}

TEST_CASE("a receive matches under its ignore mask and reports the sender's full tag") {
  for (const char* provider : providers) {
    CAPTURE(provider);
    auto ep = open_self(provider);
    const std::uint64_t high = std::uint64_t{1} << 62;
    int value = 17, got = 0, other = 0;
    recorded_op send, recv, unrelated;
    // Differs from the message's tag only in ignored bits: matches.
    REQUIRE_FALSE(ep->post_recv(pdcoll::transport::any_peer, &got, sizeof got, high | 0x100, 0xff,
                                nullptr, &recv));
    // Differs in a bit that is not ignored: must not match.
    REQUIRE_FALSE(ep->post_recv(0, &other, sizeof other, high | 0x200, 0xff, nullptr, &unrelated));
    REQUIRE_FALSE(ep->post_send(0, &value, sizeof value, high | 0x1ab, nullptr, &send));
    REQUIRE(drive_until(*ep, [&] { return recv.done() && send.done(); }, soon()));
    CHECK(recv.result.tag == (high | 0x1ab));
    CHECK(recv.result.peer == 0);
    CHECK(got == 17);
    CHECK_FALSE(unrelated.done());
    ep->cancel(&unrelated);
    REQUIRE(drive_until(*ep, [&] { return unrelated.done(); }, soon()));
    CHECK(unrelated.result.error == std::errc::operation_canceled);
  }
}

TEST_CASE("bad posts are rejected before anything is posted") {
  auto ep = open_self("shm");
  int x = 0;
  recorded_op op;
  CHECK(ep->post_send(1, &x, sizeof x, 0, nullptr, &op) == pdcoll::errc::root_out_of_range);
  CHECK(ep->post_send(-1, &x, sizeof x, 0, nullptr, &op) == pdcoll::errc::root_out_of_range);
  CHECK(ep->post_send(0, &x, sizeof x, fabric::reserved_tag_bits, nullptr, &op) ==
        pdcoll::errc::invalid_argument);
  CHECK(ep->post_recv(0, nullptr, 4, 0, 0, nullptr, &op) == pdcoll::errc::null_buffer);
  CHECK(ep->post_send(0, &x, sizeof x, 0, nullptr, nullptr) == pdcoll::errc::invalid_argument);
  CHECK(ep->outstanding() == 0);
  CHECK(op.completions == 0);
}

TEST_CASE("host and emulated-device regions register and deregister") {
  for (const char* provider : providers) {
    CAPTURE(provider);
    auto ep = open_self(provider);
    CHECK(ep->path_for(memory_kind::host) == pdcoll::transport::data_path::host);
    CHECK(ep->path_for(memory_kind::emulated_device) == pdcoll::transport::data_path::hmem_iface);
    const auto gaudi = ep->path_for(memory_kind::gaudi);
    CHECK((gaudi == pdcoll::transport::data_path::hmem_iface ||
           gaudi == pdcoll::transport::data_path::host_staged));
    std::vector<unsigned char> buffer(1 << 16, 1), in(1 << 16, 0);
    pdcoll::transport::memory_region region{buffer.data(), buffer.size()};
    pdcoll::transport::registration_handle handle, in_handle;
    REQUIRE_FALSE(ep->register_region(region, handle));
    CHECK(handle.provider != nullptr);
    region.kind = memory_kind::emulated_device;
    region.address = in.data();
    REQUIRE_FALSE(ep->register_region(region, in_handle));
    recorded_op send, recv;
    REQUIRE_FALSE(ep->post_recv(0, in.data(), in.size(), 1, 0, in_handle.descriptor, &recv));
    REQUIRE_FALSE(ep->post_send(0, buffer.data(), buffer.size(), 1, handle.descriptor, &send));
    REQUIRE(drive_until(*ep, [&] { return recv.done() && send.done(); }, soon()));
    CHECK(recv.result.bytes == buffer.size());
    CHECK(in == buffer);
    ep->deregister(handle);
    ep->deregister(in_handle);
    CHECK(handle.provider == nullptr);
    pdcoll::transport::memory_region empty{};
    CHECK(ep->register_region(empty, handle) == pdcoll::errc::invalid_argument);
  }
}

TEST_CASE("destroying an endpoint completes its outstanding receives as cancelled") {
  for (const char* provider : providers) {
    CAPTURE(provider);
    std::vector<unsigned char> in(64);
    recorded_op a, b;
    {
      auto ep = open_self(provider);
      REQUIRE_FALSE(ep->post_recv(0, in.data(), in.size(), 1, 0, nullptr, &a));
      REQUIRE_FALSE(ep->post_recv(pdcoll::transport::any_peer, in.data(), in.size(), 2, 0, nullptr, &b));
    }
    CHECK(a.completions == 1);
    CHECK(b.completions == 1);
    CHECK(a.result.error == std::errc::operation_canceled);
    CHECK(b.result.error == std::errc::operation_canceled);
  }
}

TEST_CASE("a receive outstanding at close() completes with operation_canceled, not a lost peer") {
  for (const char* provider : providers) {
    CAPTURE(provider);
    auto ep = open_self(provider);
    recorded_op recv;
    char buffer[64];
    REQUIRE_FALSE(ep->post_recv(0, buffer, sizeof buffer, 1, 0, nullptr, &recv));
    ep->close();  // shm's close writes FI_ECANCELED entries; rxm's is abandoned
    REQUIRE(drive_until(*ep, [&] { return recv.done(); }, soon()));
    CHECK(recv.completions == 1);
    CHECK(recv.result.error == std::errc::operation_canceled);
  }
}

namespace {
fabric::fabric_endpoint* cancelling_endpoint = nullptr;
struct cancelling_op : pdcoll::transport::completion_context {
  pdcoll::transport::completion_context* sibling = nullptr;
  int completions = 0;
  pdcoll::transport::completion result;
};
}  // namespace

TEST_CASE("a queued receive cancelled from another queued operation's completion is never posted") {
  // shm's receive queue holds 1024 receives: later ones wait in the
  // endpoint's queue. A's cancel ends it from that queue, and its callback
  // cancels B, queued behind it (a failed transfer's collective cancelling
  // its siblings). B must end cancelled, not be posted and take a message.
  auto ep = open_self("shm");
  cancelling_endpoint = ep.get();
  std::vector<recorded_op> fillers(1024);
  std::vector<char> filler_bytes(fillers.size() * 8);
  for (std::size_t i = 0; i < fillers.size(); ++i)
    REQUIRE_FALSE(ep->post_recv(0, &filler_bytes[i * 8], 8, 1, 0, nullptr, &fillers[i]));
  cancelling_op a;
  recorded_op b;
  char a_bytes[8], b_bytes[8] = {};
  a.sibling = &b;
  a.on_complete = [](pdcoll::transport::completion_context* self, const pdcoll::transport::completion& r) noexcept {
    auto* op = static_cast<cancelling_op*>(self);
    ++op->completions;
    op->result = r;
    cancelling_endpoint->cancel(op->sibling);
  };
  REQUIRE_FALSE(ep->post_recv(0, a_bytes, 8, 2, 0, nullptr, &a));
  REQUIRE_FALSE(ep->post_recv(0, b_bytes, 8, 3, 0, nullptr, &b));
  REQUIRE(ep->deferred_now() == 2);
  ep->cancel(&a);
  for (int i = 0; i < 10; ++i) ep->progress();
  ep->cancel(&fillers[0]);  // room in the provider's queue for whatever is still queued
  for (int i = 0; i < 10; ++i) ep->progress();
  const char message[8] = "hello!!";
  recorded_op send;
  REQUIRE_FALSE(ep->post_send(0, message, sizeof message, 3, nullptr, &send));
  REQUIRE(drive_until(*ep, [&] { return b.done(); }, soon()));
  CHECK(a.result.error == std::errc::operation_canceled);
  CHECK(b.completions == 1);
  CHECK(b.result.error == std::errc::operation_canceled);
  CHECK(b_bytes[0] == 0);
  for (auto& f : fillers) ep->cancel(&f);
  ep->close();
  for (int i = 0; i < 10; ++i) ep->progress();
  cancelling_endpoint = nullptr;
}

TEST_CASE("the shm copy probe's verdict: every rank's figures summed, the lowest rank's PDCOLL_NODE_BULK first") {
  using fabric::detail::bulk_through_slots;
  // Figures are "<kernel ns>/<two user copies ns>" per 256 KiB, in rank order.
  CHECK(bulk_through_slots({"17000/4000", "16000/4200"}, true));
  CHECK_FALSE(bulk_through_slots({"13000/17000", "12000/16000"}, true));
  CHECK(bulk_through_slots({"10000/30000", "30000/5000"}, true));  // summed: 40,000 against 35,000
  CHECK_FALSE(bulk_through_slots({"10000/30000", "25000/5000"}, true));
  CHECK_FALSE(bulk_through_slots({"17000/4000", "messages", "slots"}, true));
  CHECK(bulk_through_slots({"13000/17000", "slots", "messages"}, true));
  // Messages would not take one kernel copy: some pair may not read each
  // other, some rank has no kernel figure (refused, FI_HMEM) or none at all.
  CHECK(bulk_through_slots({"13000/17000", "12000/16000"}, false));
  CHECK(bulk_through_slots({"13000/17000", "0/16000"}, true));
  CHECK(bulk_through_slots({"13000/17000", "-"}, true));
  CHECK(bulk_through_slots({"13000/17000", "garbage"}, true));
  CHECK(bulk_through_slots({}, true));
  // A forced choice holds either way.
  CHECK_FALSE(bulk_through_slots({"0/16000", "messages"}, false));

  const auto probe = fabric::detail::measure_copies();
  CHECK(probe.user_ns > 0);
  std::vector<std::byte> word(8);
  iovec local{word.data(), word.size()}, remote{word.data(), word.size()};
  const bool readable = ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == 8;
  CHECK((probe.kernel_ns > 0) == readable);
}

TEST_CASE("an shm endpoint publishes its copy probe and takes the verdict, or PDCOLL_NODE_BULK's") {
  const char* before = std::getenv("PDCOLL_NODE_BULK");
  const std::string saved = before ? before : "";
  auto restore = [&] {
    if (before) ::setenv("PDCOLL_NODE_BULK", saved.c_str(), 1);
    else ::unsetenv("PDCOLL_NODE_BULK");
  };
  for (const char* value : {"slots", "messages", "measure"}) {
    CAPTURE(value);
    if (std::string(value) == "measure") ::unsetenv("PDCOLL_NODE_BULK");
    else ::setenv("PDCOLL_NODE_BULK", value, 1);
    auto ep = open_self("shm");
    restore();
    auto* node = ep->shared_node_memory();
    REQUIRE(node != nullptr);
    REQUIRE(ep->copy_probe_tokens().size() == 1);
    const std::string token = ep->copy_probe_tokens()[0];
    if (std::string(value) != "measure") {
      CHECK(token == value);
      CHECK(node->bulk_through_slots() == (std::string(value) == "slots"));
    } else {
      // The figures this process measured, read back as the verdict read them.
      unsigned long long kernel = 0, user = 0;
      REQUIRE(std::sscanf(token.c_str(), "%llu/%llu", &kernel, &user) == 2);
      const auto probe = fabric::detail::measured_copies();
      CHECK(user == probe.user_ns);
      CHECK((kernel == probe.kernel_ns || kernel == 0));
      // One rank: no pair that may not read each other.
      CHECK(node->bulk_through_slots() == fabric::detail::bulk_through_slots({token}, true));
    }
  }
  auto tcp = open_self("tcp");
  CHECK(tcp->shared_node_memory() == nullptr);
  CHECK(tcp->copy_probe_tokens().empty());
}
