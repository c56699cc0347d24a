// Node-shareable host memory (memory/node_shareable.hpp) and the cache of
// peers' mappings (memory/peer_mappings.hpp): a child process stands in for
// the peer rank that owns the buffers.
#include <doctest/doctest.h>

#include <pdcoll/memory/host.hpp>
#include <pdcoll/memory/peer_mappings.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace mem = pdcoll::memory;

namespace {

/// A child process that allocates `count` shareable buffers of `elements`
/// uint32 each (buffer k holds k * 1000 + i), describes them through a pipe
/// and keeps them until told to free them, then reports how many bytes of
/// its first buffer's file remain.
class owner_process {
 public:
  owner_process(int count, std::size_t elements) {
    REQUIRE(::pipe(to_child_) == 0);
    REQUIRE(::pipe(from_child_) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) child(count, elements);
    ::close(to_child_[0]);
    ::close(from_child_[1]);
    ranges.resize(static_cast<std::size_t>(count));
    for (auto& r : ranges) REQUIRE(read_all(&r, sizeof r));
  }
  /// Tells the child to free its buffers; returns its first buffer's file
  /// size after the free, as the child saw it through its own fd.
  std::int64_t free_buffers() {
    const char go = 'f';
    REQUIRE(::write(to_child_[1], &go, 1) == 1);
    std::int64_t remaining = -1;
    REQUIRE(read_all(&remaining, sizeof remaining));
    return remaining;
  }
  ~owner_process() {
    ::close(to_child_[1]);
    ::close(from_child_[0]);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  std::vector<mem::shareable_range> ranges;

 private:
  bool read_all(void* to, std::size_t bytes) {
    auto* p = static_cast<char*>(to);
    while (bytes > 0) {
      const ssize_t got = ::read(from_child_[0], p, bytes);
      if (got <= 0) return false;
      p += got;
      bytes -= static_cast<std::size_t>(got);
    }
    return true;
  }
  [[noreturn]] void child(int count, std::size_t elements) {
    ::close(to_child_[1]);  // or the parent's close would never read as end of file here
    ::close(from_child_[0]);
    std::vector<mem::host_buffer<std::uint32_t>> buffers;
    for (int k = 0; k < count; ++k) {
      buffers.push_back(mem::host::allocate_shareable<std::uint32_t>(elements));
      for (std::size_t i = 0; i < elements; ++i) buffers.back().data()[i] = static_cast<std::uint32_t>(k * 1000 + i);
      const auto range = mem::find_shareable(buffers.back().data(), buffers.back().size_bytes());
      const mem::shareable_range none{};
      (void)!::write(from_child_[1], range ? &*range : &none, sizeof none);
    }
    char go = 0;
    (void)!::read(to_child_[0], &go, 1);
    // The first buffer's fd stays open across the free only through a dup.
    const int kept = ::dup(static_cast<int>(mem::find_shareable(buffers[0].data(), 4)->fd));
    buffers.clear();
    struct stat st {};
    const std::int64_t remaining = ::fstat(kept, &st) == 0 ? static_cast<std::int64_t>(st.st_size) : -1;
    (void)!::write(from_child_[1], &remaining, sizeof remaining);
    (void)!::read(to_child_[0], &go, 1);  // until the parent closes the pipe
    ::_exit(0);
  }

  pid_t pid_ = -1;
  int to_child_[2]{-1, -1};
  int from_child_[2]{-1, -1};
};

}  // namespace

TEST_CASE("a shareable host buffer is zero-filled, shareable, and found by any range inside it") {
  auto buf = mem::host::allocate_shareable<float>(3000);
  REQUIRE(buf.size() == 3000);
  CHECK(buf.shareable());
  bool all_zero = true;
  for (float v : buf.span()) all_zero = all_zero && v == 0.0f;
  CHECK(all_zero);
  const auto whole = mem::find_shareable(buf.data(), buf.size_bytes());
  REQUIRE(whole);
  CHECK(whole->shareable());
  CHECK(whole->offset == 0);
  CHECK(whole->pid == static_cast<std::uint64_t>(::getpid()));
  CHECK(whole->segment_bytes == buf.mapped_bytes());
  const auto inner = mem::find_shareable(buf.data() + 100, 400);
  REQUIRE(inner);
  CHECK(inner->offset == 400);
  CHECK(inner->inode == whole->inode);
  // Past the mapping's end, and ordinary memory: not shareable.
  CHECK_FALSE(mem::find_shareable(buf.data() + 100, buf.mapped_bytes()));
  auto plain = mem::host::allocate<float>(3000);
  CHECK_FALSE(plain.shareable());
  CHECK_FALSE(mem::find_shareable(plain.data(), 4));
  std::vector<float> vec(10);
  CHECK_FALSE(mem::find_shareable(vec.data(), 4));
  // Freed: forgotten.
  const void* address = buf.data();
  buf.reset();
  CHECK_FALSE(mem::find_shareable(address, 4));
}

TEST_CASE("two shareable buffers are different files; moving one keeps it shareable") {
  auto a = mem::host::allocate_shareable<int>(10);
  auto b = mem::host::allocate_shareable<int>(10);
  CHECK(mem::find_shareable(a.data(), 4)->inode != mem::find_shareable(b.data(), 4)->inode);
  auto moved = std::move(a);
  CHECK(moved.shareable());
  CHECK_FALSE(a.shareable());
  CHECK(mem::find_shareable(moved.data(), 40));
}

TEST_CASE("another process maps a shareable buffer read-only, sees its contents, and keeps one mapping per buffer") {
  owner_process owner(2, 5000);
  mem::detail::peer_mappings cache;
  for (int k = 0; k < 2; ++k) {
    auto range = owner.ranges[static_cast<std::size_t>(k)];
    REQUIRE(range.shareable());
    range.offset += 4 * 10;  // from element 10
    auto pinned = cache.resolve(range, 12);
    REQUIRE(pinned.address() != nullptr);
    std::uint32_t values[3];
    std::memcpy(values, pinned.address(), sizeof values);
    CHECK(values[0] == static_cast<std::uint32_t>(k * 1000 + 10));
    CHECK(values[2] == static_cast<std::uint32_t>(k * 1000 + 12));
  }
  CHECK(cache.size() == 2);
  auto again = cache.resolve(owner.ranges[0], 4);
  CHECK(again.address() != nullptr);
  CHECK(cache.size() == 2);
  // Freeing empties the file: the pages are gone although this process still maps it.
  CHECK(owner.free_buffers() == 0);
}

TEST_CASE("a range that cannot be mapped resolves to nullptr: not shareable, too long, another file, a process that is gone") {
  mem::detail::peer_mappings cache;
  CHECK(cache.resolve(mem::shareable_range{}, 4).address() == nullptr);
  owner_process owner(1, 100);
  const auto range = owner.ranges[0];
  CHECK(cache.resolve(range, range.segment_bytes + 1).address() == nullptr);
  auto wrong_size = range;
  wrong_size.segment_bytes += 4096;
  CHECK(cache.resolve(wrong_size, 4).address() == nullptr);
  auto other_file = range;
  other_file.inode += 1;
  CHECK(cache.resolve(other_file, 4).address() == nullptr);
  auto gone = range;
  gone.pid = 0x7ffffff0;  // above any pid_max
  CHECK(cache.resolve(gone, 4).address() == nullptr);
  CHECK(cache.size() == 0);
  CHECK(cache.resolve(range, range.segment_bytes).address() != nullptr);
}

TEST_CASE("freeing a shareable buffer empties its file, unless a collective marked it keep_pages") {
  for (bool keep : {false, true}) {
    CAPTURE(keep);
    auto buf = mem::host::allocate_shareable<float>(5000);
    const int kept = ::dup(static_cast<int>(mem::find_shareable(buf.data(), 4)->fd));
    REQUIRE(kept >= 0);
    if (keep) mem::detail::shareable_segments().keep_pages(buf.data() + 10);
    const std::size_t mapped = buf.mapped_bytes();
    buf.reset();
    struct stat st {};
    REQUIRE(::fstat(kept, &st) == 0);
    CHECK(static_cast<std::size_t>(st.st_size) == (keep ? mapped : 0));
    ::close(kept);
  }
}

// After fork() without exec, parent and child share the memfd and its
// MAP_SHARED pages: the child's freeing its inherited copy (a snapshot
// writer, a forked worker dropping what it inherited) must leave the
// parent's live buffer whole.
TEST_CASE("a forked child freeing its inherited copy of a shareable buffer leaves the parent's intact") {
  auto buf = mem::host::allocate_shareable<float>(1 << 16);
  for (std::size_t i = 0; i < buf.size(); ++i) buf.data()[i] = 1.0f;
  const std::size_t mapped = buf.mapped_bytes();
  const int kept = ::dup(static_cast<int>(mem::find_shareable(buf.data(), 4)->fd));
  REQUIRE(kept >= 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    buf.reset();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  struct stat st {};
  REQUIRE(::fstat(kept, &st) == 0);
  ::close(kept);
  // Checked on the file's size, not by reading: an emptied file's pages fault.
  REQUIRE(static_cast<std::size_t>(st.st_size) == mapped);
  double sum = 0;
  for (std::size_t i = 0; i < buf.size(); ++i) sum += buf.data()[i];
  CHECK(sum == static_cast<double>(buf.size()));
}

TEST_CASE("the peer-mapping cache evicts the least recently used unpinned mappings, never a pinned one") {
  const int count = static_cast<int>(mem::detail::peer_mappings::capacity) + 6;
  owner_process owner(count, 16);
  mem::detail::peer_mappings cache;
  auto held = cache.resolve(owner.ranges[0], 4);  // pinned throughout
  REQUIRE(held.address() != nullptr);
  for (int k = 1; k < count; ++k) {
    auto p = cache.resolve(owner.ranges[static_cast<std::size_t>(k)], 4);
    REQUIRE(p.address() != nullptr);
    std::uint32_t first = 0;
    std::memcpy(&first, p.address(), sizeof first);
    CHECK(first == static_cast<std::uint32_t>(k * 1000));
  }
  CHECK(cache.size() == mem::detail::peer_mappings::capacity);
  std::uint32_t first = 1;
  std::memcpy(&first, held.address(), sizeof first);
  CHECK(first == 0);
  // Every mapping pinned: the cache grows past its capacity rather than fail.
  std::vector<mem::detail::peer_mappings::pinned> all;
  for (int k = 0; k < count; ++k) all.push_back(cache.resolve(owner.ranges[static_cast<std::size_t>(k)], 4));
  CHECK(cache.size() == static_cast<std::size_t>(count));
}
