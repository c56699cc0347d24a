// Gaudi domain: its ioctl sequence and arguments against a fake habanalabs
// driver that checks every call and fails the way the kernel does, and the
// same smoke test against a real device node when there is one.
#include <doctest/doctest.h>

#include <pdcoll/memory/gaudi.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace mem = pdcoll::memory;

namespace {

constexpr std::uint32_t pci_gaudi1 = 0x1000;
constexpr std::uint32_t pci_gaudi2 = 0x1020;
constexpr std::uint32_t pci_goya = 0x0001;

// Newer uAPI headers export by {addr, offset}, older ones by {handle}.
template <class Request>
constexpr bool exports_by_address = requires(Request x) { x.offset; };

// The export request's address-ish field under either uAPI layout.
template <class Request>
std::uint64_t export_key(const Request& r) {
  if constexpr (requires(Request x) { x.offset; })
    return r.addr;
  else
    return r.handle;
}
template <class Request>
std::uint64_t export_offset(const Request& r) {
  if constexpr (requires(Request x) { x.offset; })
    return r.offset;
  else
    return 0;
}

// A habanalabs device in user space: allocations, mappings and DMA-BUF
// exports, with the kernel's argument checks and errnos. Every argument it
// refuses is also written to `violations`, so a test can tell "the kernel
// would have said EINVAL" from an injected failure.
class fake_habanalabs final : public mem::gaudi_driver {
 public:
  std::string node = "/dev/accel/accel3";
  std::uint32_t pci_id = pci_gaudi2;
  std::uint64_t page = 64 * 1024;
  std::uint64_t dram_base = 0x20000000;
  std::uint64_t dram_size = 4 * 1024 * 1024;
  bool dmabuf_mmap = true;
  std::map<std::uint32_t, int> fail_op;  // HL_MEM_OP_* → errno, once

  std::vector<std::string> calls;
  std::vector<std::string> violations;

  struct device_allocation {
    std::uint64_t size = 0;
    std::uint64_t va = 0;
    std::vector<std::byte> bytes;
  };
  std::map<std::uint64_t, device_allocation> allocations;  // handle → allocation (Gaudi2)
  std::map<std::uint64_t, std::vector<std::byte>> physical;  // Gaudi1: exported physical ranges
  struct exported {
    std::byte* bytes;
    std::uint64_t size;
  };
  std::map<int, exported> dmabufs;
  std::map<void*, std::size_t> mappings;
  int device_fd = -1;
  std::uint64_t used = 0;

  int open(const char* path, int flags) noexcept override {
    calls.push_back("open");
    if (path != node) return -ENOENT;
    if (flags != (O_RDWR | O_CLOEXEC)) violations.push_back("open flags");
    device_fd = 7;
    return device_fd;
  }

  int close(int fd) noexcept override {
    calls.push_back("close");
    if (fd == device_fd) {
      device_fd = -1;
      return 0;
    }
    if (dmabufs.erase(fd) == 1) return 0;
    violations.push_back("close of unknown fd");
    return -EBADF;
  }

  int mmap(int fd, std::size_t length, int prot, void** address) noexcept override {
    calls.push_back("mmap");
    const auto it = dmabufs.find(fd);
    if (it == dmabufs.end()) return -EBADF;
    if (!dmabuf_mmap) return -ENODEV;  // what dma_buf_mmap gives for an exporter without mmap
    if (length > it->second.size || prot != (PROT_READ | PROT_WRITE)) violations.push_back("mmap arguments");
    *address = it->second.bytes;
    mappings.emplace(*address, length);
    return 0;
  }

  int munmap(void* address, std::size_t length) noexcept override {
    calls.push_back("munmap");
    const auto it = mappings.find(address);
    if (it == mappings.end() || it->second != length) {
      violations.push_back("munmap arguments");
      return -EINVAL;
    }
    mappings.erase(it);
    return 0;
  }

  int ioctl(int fd, unsigned long request, void* argument) noexcept override {
    if (fd != device_fd || device_fd < 0) return -EBADF;
    // The kernel takes the request's direction and size from its number: an
    // index (what HL_IOCTL_* are under the DRM header) is another request.
    if (_IOC_DIR(request) != (_IOC_READ | _IOC_WRITE)) violations.push_back("ioctl request without read-write direction");
    if (request == pdcoll::memory::detail::hl_info_request && _IOC_SIZE(request) == sizeof(hl_info_args))
      return info(*static_cast<hl_info_args*>(argument));
    if (request == pdcoll::memory::detail::hl_memory_request && _IOC_SIZE(request) == sizeof(hl_mem_args))
      return memory(*static_cast<hl_mem_args*>(argument));
    violations.push_back("unknown ioctl");
    return -ENOTTY;
  }

  bool gaudi1() const { return pci_id == pci_gaudi1; }

 private:
  int refuse(const std::string& why, int error = EINVAL) {
    violations.push_back(why);
    return -error;
  }

  int info(hl_info_args& args) {
    calls.push_back("INFO");
    if (args.op != HL_INFO_HW_IP_INFO) return refuse("INFO op");
    if (args.return_pointer == 0 || args.return_size != sizeof(hl_info_hw_ip_info)) return refuse("INFO size");
    hl_info_hw_ip_info hw{};
    hw.device_id = pci_id;
    hw.dram_base_address = dram_base;
    hw.dram_size = dram_size;
    hw.dram_page_size = page;
    hw.device_mem_alloc_default_page_size = gaudi1() ? 0 : page;
    std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(args.return_pointer)), &hw, sizeof hw);
    return 0;
  }

  int memory(hl_mem_args& args) {
    const hl_mem_in in = args.in;
    if (in.ctx_id != 0) return refuse("ctx_id");
    if (auto it = fail_op.find(in.op); it != fail_op.end()) {
      const int error = it->second;
      fail_op.erase(it);
      calls.push_back("failed op " + std::to_string(in.op));
      return -error;
    }
    std::memset(&args, 0, sizeof args);  // the kernel clears the union before writing the answer
    switch (in.op) {
      case HL_MEM_OP_ALLOC: {
        calls.push_back("ALLOC");
        if (gaudi1()) return refuse("ALLOC on Gaudi1 allocates nothing; pdcoll must not rely on it");
        if (in.flags != 0) return refuse("ALLOC flags");
        if (in.alloc.page_size != 0) return refuse("ALLOC page_size");
        if (in.alloc.mem_size == 0 || in.alloc.mem_size % page != 0) return refuse("ALLOC size not page-aligned");
        if (used + in.alloc.mem_size > dram_size) return -ENOMEM;
        used += in.alloc.mem_size;
        const std::uint64_t handle = next_handle_++;
        allocations[handle].size = in.alloc.mem_size;
        args.out.handle = handle;
        return 0;
      }
      case HL_MEM_OP_MAP: {
        calls.push_back("MAP");
        if (in.flags & HL_MEM_USERPTR) return refuse("MAP of device memory with USERPTR");
        if (in.map_device.hint_addr != 0) return refuse("MAP hint");
        const auto it = allocations.find(in.map_device.handle);
        if (it == allocations.end()) return refuse("MAP of unknown handle");
        if (it->second.va != 0) return refuse("MAP of a mapped handle");
        it->second.va = next_va_;
        next_va_ += it->second.size + page;
        args.out.device_virt_addr = it->second.va;
        return 0;
      }
      case HL_MEM_OP_EXPORT_DMABUF_FD: {
        calls.push_back("EXPORT");
        if (in.flags != (O_RDWR | O_CLOEXEC)) return refuse("EXPORT fd flags");
        const std::uint64_t key = export_key(in.export_dmabuf_fd);
        const std::uint64_t size = in.export_dmabuf_fd.mem_size;
        if (export_offset(in.export_dmabuf_fd) != 0) return refuse("EXPORT offset");
        std::byte* bytes = nullptr;
        if (gaudi1()) {
          if (key % page != 0 || key < dram_base || key + size > dram_base + dram_size)
            return refuse("EXPORT physical address");
          if (size == 0 || size % page != 0) return refuse("EXPORT size");
          auto& range = physical[key];
          range.resize(size);
          bytes = range.data();
        } else {
          device_allocation* found = nullptr;
          for (auto& [handle, a] : allocations) {
            constexpr bool by_handle = !exports_by_address<decltype(in.export_dmabuf_fd)>;
            if ((by_handle ? handle : a.va) == key) found = &a;
          }
          if (found == nullptr) return refuse("EXPORT of unknown memory");
          if (found->va == 0) return refuse("EXPORT of unmapped memory");
          if (size != found->size) return refuse("EXPORT size");
          found->bytes.resize(size);
          bytes = found->bytes.data();
        }
        const int fd = next_fd_++;
        dmabufs.emplace(fd, exported{bytes, size});
        args.out.fd = fd;
        return 0;
      }
      case HL_MEM_OP_UNMAP: {
        calls.push_back("UNMAP");
        for (auto& [handle, a] : allocations)
          if (a.va != 0 && a.va == in.unmap.device_virt_addr) {
            a.va = 0;
            return 0;
          }
        return refuse("UNMAP of unmapped address");
      }
      case HL_MEM_OP_FREE: {
        calls.push_back("FREE");
        const auto it = allocations.find(in.free.handle);
        if (it == allocations.end()) return refuse("FREE of unknown handle");
        if (it->second.va != 0) return refuse("FREE of a mapped handle");
        used -= it->second.size;
        allocations.erase(it);
        return 0;
      }
      default:
        return refuse("unknown memory op");
    }
  }

  std::uint64_t next_handle_ = 0x100;
  std::uint64_t next_va_ = 0x1000000000000;
  int next_fd_ = 40;
};

template <class F>
std::error_code error_of(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const std::system_error& e) {
    if (what != nullptr) *what = e.what();
    return e.code();
  }
  return {};
}

std::vector<std::string> since(const std::vector<std::string>& calls, std::size_t from) {
  return {calls.begin() + static_cast<std::ptrdiff_t>(from), calls.end()};
}

}  // namespace

TEST_CASE("opening a Gaudi2 reads HW_IP_INFO and takes the driver's allocation page size") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  CHECK(driver.calls == std::vector<std::string>{"open", "INFO"});
  CHECK(dev.device_generation() == mem::gaudi::generation::gaudi2_or_later);
  CHECK(dev.pci_device_id() == pci_gaudi2);
  CHECK(dev.allocation_granule() == driver.page);
  CHECK(dev.ordinal() == 3);
  CHECK(dev.dram_size() == driver.dram_size);
  CHECK_FALSE(dev.reduces_on_device());
  CHECK(driver.violations.empty());
}

TEST_CASE("a Gaudi2 allocation is ALLOC, MAP, EXPORT with whole pages, freed as close, UNMAP, FREE") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  const std::size_t before = driver.calls.size();
  {
    auto buf = dev.allocate<float>(1000);  // 4000 bytes → one 64 KiB page
    CHECK(since(driver.calls, before) == std::vector<std::string>{"ALLOC", "MAP", "EXPORT"});
    REQUIRE(driver.allocations.size() == 1);
    CHECK(driver.allocations.begin()->second.size == driver.page);
    CHECK(buf.view().device_address() == driver.allocations.begin()->second.va);
    CHECK(dev.allocation_count() == 1);
  }
  CHECK(since(driver.calls, before) ==
        std::vector<std::string>{"ALLOC", "MAP", "EXPORT", "close", "UNMAP", "FREE"});
  CHECK(driver.allocations.empty());
  CHECK(driver.dmabufs.empty());
  CHECK(driver.violations.empty());
  CHECK_FALSE(dev.last_release_error());
}

TEST_CASE("export_dmabuf of a Gaudi subview gives the allocation's DMA-BUF and the view's offset") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  auto buf = dev.allocate<std::uint16_t>(3000);
  const auto sub = buf.view().subview(100, 50);
  const auto exported = dev.export_dmabuf(sub);
  REQUIRE(driver.dmabufs.count(exported.fd) == 1);
  CHECK(exported.offset == 200);
  CHECK(exported.length == 100);
  const auto region = mem::detail::fabric_region(sub);
  CHECK(region.kind == pdcoll::transport::memory_kind::gaudi);
  CHECK(region.hmem_iface == FI_HMEM_SYNAPSEAI);
  CHECK(region.hmem_iface == 5);
  CHECK(region.device_id == 3);
  CHECK(reinterpret_cast<std::uintptr_t>(region.address) == sub.device_address());
  CHECK(region.dmabuf_fd == exported.fd);
  CHECK(region.dmabuf_offset == 200);
  CHECK(region.length == 100);
  CHECK(dev.counters() == mem::copy_counters{});
}

TEST_CASE("an ALLOC the device cannot satisfy fails with ENOMEM and leaves nothing behind") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  std::string what;
  const auto error = error_of([&] { (void)dev.allocate<std::byte>(driver.dram_size + 1); }, &what);
  CHECK(error == std::errc::not_enough_memory);
  CHECK(error.category() == std::system_category());
  CHECK(what.find("HL_MEM_OP_ALLOC") != std::string::npos);
  CHECK(driver.allocations.empty());
  CHECK(driver.violations.empty());
}

TEST_CASE("an export the driver refuses with EPERM undoes the map and the allocation") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  driver.fail_op[HL_MEM_OP_EXPORT_DMABUF_FD] = EPERM;
  const std::size_t before = driver.calls.size();
  CHECK(error_of([&] { (void)dev.allocate<int>(10); }) == std::errc::operation_not_permitted);
  CHECK(since(driver.calls, before) ==
        std::vector<std::string>{"ALLOC", "MAP", "failed op 5", "UNMAP", "FREE"});
  CHECK(driver.allocations.empty());
  CHECK(dev.allocation_count() == 0);
  CHECK(driver.violations.empty());
  // The device still works afterwards.
  auto buf = dev.allocate<int>(10);
  CHECK(buf.size() == 10);
}

TEST_CASE("a MAP failure frees the handle it was given") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  driver.fail_op[HL_MEM_OP_MAP] = EINVAL;
  CHECK(error_of([&] { (void)dev.allocate<int>(10); }) == std::errc::invalid_argument);
  CHECK(driver.allocations.empty());
  CHECK(driver.calls.back() == "FREE");
  CHECK(driver.violations.empty());
}

TEST_CASE("Gaudi1 carves its own DRAM and exports by physical address without ALLOC or MAP") {
  fake_habanalabs driver;
  driver.pci_id = pci_gaudi1;
  driver.dram_base = 0x20000000 + 4096;  // not granule-aligned: the domain must round up
  mem::gaudi dev(driver.node, driver);
  CHECK(dev.device_generation() == mem::gaudi::generation::gaudi1);
  const std::size_t before = driver.calls.size();
  std::uint64_t first = 0;
  {
    auto a = dev.allocate<double>(10);
    auto b = dev.allocate<double>(10);
    first = a.view().device_address();
    CHECK(first % driver.page == 0);
    CHECK(first >= driver.dram_base);
    CHECK(b.view().device_address() == first + driver.page);
    CHECK(since(driver.calls, before) == std::vector<std::string>{"EXPORT", "EXPORT"});
    CHECK(driver.physical.count(first) == 1);
    const auto exported = dev.export_dmabuf(b.view().subview(2));
    CHECK(exported.offset == 16);
    CHECK(exported.length == 64);
  }
  CHECK(since(driver.calls, before) == std::vector<std::string>{"EXPORT", "EXPORT", "close", "close"});
  auto again = dev.allocate<double>(10);
  CHECK(again.view().device_address() == first);
  // Whole DRAM minus the alignment loss: the last granule cannot be used.
  CHECK(error_of([&] { (void)dev.allocate<std::byte>(driver.dram_size); }) == std::errc::not_enough_memory);
  CHECK(driver.violations.empty());
}

TEST_CASE("Gaudi copies go through the DMA-BUF mapping, round-trip, and are counted") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  std::vector<std::int32_t> input(100);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = static_cast<std::int32_t>(i * 3);
  const std::size_t before = driver.calls.size();
  {
    auto buf = dev.allocate<std::int32_t>(200);
    dev.copy_from_host(std::span<const std::int32_t>(input), buf.view().subview(100));
    std::vector<std::int32_t> output(100);
    dev.copy_to_host(buf.const_view().subview(100), std::span<std::int32_t>(output));
    CHECK(output == input);
    const auto c = dev.counters();
    CHECK(c.host_to_device_bytes == 400);
    CHECK(c.host_to_device_calls == 1);
    CHECK(c.device_to_host_bytes == 400);
    CHECK(c.device_to_host_calls == 1);
  }
  // One mmap for both copies, undone before the DMA-BUF is closed.
  CHECK(since(driver.calls, before) ==
        std::vector<std::string>{"ALLOC", "MAP", "EXPORT", "mmap", "munmap", "close", "UNMAP", "FREE"});
  CHECK(driver.mappings.empty());
  CHECK(driver.violations.empty());
}

TEST_CASE("Gaudi copies fail with the mmap errno when the DMA-BUF cannot be mapped, counting nothing") {
  fake_habanalabs driver;
  driver.dmabuf_mmap = false;
  mem::gaudi dev(driver.node, driver);
  auto buf = dev.allocate<std::int32_t>(4);
  std::vector<std::int32_t> host(4);
  std::string what;
  const auto error = error_of([&] { dev.copy_to_host(buf.view(), std::span<std::int32_t>(host)); }, &what);
  CHECK(error == std::errc::no_such_device);
  CHECK(what.find("mmap of the DMA-BUF") != std::string::npos);
  CHECK(error_of([&] { dev.copy_from_host(std::span<const std::int32_t>(host), buf.view()); }) ==
        std::errc::no_such_device);
  CHECK(dev.counters() == mem::copy_counters{});
}

TEST_CASE("Gaudi copies and exports reject views of freed memory and too small destinations") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  pdcoll::view<int, mem::gaudi> stale;
  {
    auto buf = dev.allocate<int>(8);
    stale = buf.view();
    std::vector<int> small(4);
    CHECK(error_of([&] { dev.copy_to_host(buf.view(), std::span<int>(small)); }) == pdcoll::errc::buffer_too_small);
  }
  std::vector<int> host(8);
  CHECK(error_of([&] { dev.copy_to_host(stale, std::span<int>(host)); }) == pdcoll::errc::invalid_argument);
  CHECK(error_of([&] { (void)dev.export_dmabuf(stale); }) == pdcoll::errc::invalid_argument);
  CHECK(mem::detail::fabric_region(stale).dmabuf_fd == -1);
}

TEST_CASE("the Gaudi invalidation hook runs while the memory is still mapped and exported") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  bool mapped_during_hook = false;
  bool exported_during_hook = false;
  pdcoll::transport::memory_region seen;
  const auto id = dev.add_invalidation_hook([&](const pdcoll::transport::memory_region& r) {
    seen = r;
    mapped_during_hook = !driver.allocations.empty() && driver.allocations.begin()->second.va != 0;
    exported_during_hook = driver.dmabufs.count(r.dmabuf_fd) == 1;
  });
  auto buf = dev.allocate<double>(32);
  const auto expected = mem::detail::fabric_region(buf.view());
  buf.reset();
  CHECK(mapped_during_hook);
  CHECK(exported_during_hook);
  CHECK(seen.address == expected.address);
  CHECK(seen.length == 256);
  CHECK(seen.dmabuf_fd == expected.dmabuf_fd);
  CHECK(seen.hmem_iface == FI_HMEM_SYNAPSEAI);
  dev.remove_invalidation_hook(id);
}

TEST_CASE("a failed UNMAP during free is kept in last_release_error and FREE is still attempted") {
  fake_habanalabs driver;
  mem::gaudi dev(driver.node, driver);
  {
    auto buf = dev.allocate<int>(1);
    driver.fail_op[HL_MEM_OP_UNMAP] = EINVAL;
  }
  CHECK(dev.last_release_error() == std::errc::invalid_argument);
  // The kernel refuses to free a handle that is still mapped: the fake says so too.
  CHECK(driver.violations == std::vector<std::string>{"FREE of a mapped handle"});
}

TEST_CASE("opening fails with the driver's errno, and non-Gaudi ASICs are refused as errc::device") {
  fake_habanalabs driver;
  std::string what;
  CHECK(error_of([&] { mem::gaudi dev("/dev/accel/accel9", driver); }, &what) ==
        std::errc::no_such_file_or_directory);
  CHECK(what.find("/dev/accel/accel9") != std::string::npos);
  driver.pci_id = pci_goya;
  CHECK(error_of([&] { mem::gaudi dev(driver.node, driver); }) == pdcoll::errc::device);
  CHECK(driver.device_fd == -1);  // closed again
}

TEST_CASE("the Gaudi domain works against a real habanalabs device when one is present") {
  const auto paths = mem::gaudi::device_paths();
  if (paths.empty()) {
    MESSAGE("skipped: no /dev/accel/accel* or /dev/hl* device node on this machine");
    return;
  }
  mem::gaudi dev(paths.front());
  MESSAGE("testing " << dev.path() << " (PCI id " << dev.pci_device_id() << ")");
  auto buf = dev.allocate<float>(1 << 20);
  const auto exported = dev.export_dmabuf(buf.view().subview(1024));
  CHECK(exported.fd >= 0);
  CHECK(exported.offset == 4096);
  CHECK(exported.length == ((1u << 20) - 1024) * sizeof(float));
  std::vector<float> host(16, 1.5f);
  try {
    dev.copy_from_host(std::span<const float>(host), buf.view());
    std::vector<float> back(16);
    dev.copy_to_host(buf.view().subview(0, 16), std::span<float>(back));
    CHECK(back == host);
  } catch (const std::system_error& e) {
    MESSAGE("host-staged copies unavailable on this device: " << e.what());
  }
  buf.reset();
  CHECK_FALSE(dev.last_release_error());
}
