// File: tests/unit/allocation_counter.hpp — replaces the global operator
// new/delete of the test binary that includes it (include it from exactly one
// source file of that binary) and counts the allocations a thread makes
// inside an allocation_counter scope; a failing_allocation scope makes one
// of them throw std::bad_alloc.
#pragma once

#include <cstdlib>
#include <new>

namespace {
thread_local bool counting = false;
thread_local long allocations = 0;
thread_local long fail_at = 0;  // > 0: that counted allocation fails

/// Counts this thread's allocations while it lives.
struct allocation_counter {
  allocation_counter() {
    allocations = 0;
    counting = true;
  }
  ~allocation_counter() { counting = false; }
  long count() const { return allocations; }
};

/// Inside its scope, this thread's `n`-th allocation (n >= 1) fails as when
/// memory runs out: std::bad_alloc, or nullptr from the nothrow forms.
struct failing_allocation : allocation_counter {
  explicit failing_allocation(long n) { fail_at = n; }
  ~failing_allocation() { fail_at = 0; }
};

/// Counts one allocation; true when it is the one to fail.
bool fails_now() {
  return counting && ++allocations == fail_at;
}

void* counted_alloc(std::size_t size) {
  if (fails_now()) throw std::bad_alloc{};
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc{};
}
void* counted_aligned_alloc(std::size_t size, std::align_val_t align) {
  if (fails_now()) throw std::bad_alloc{};
  const auto a = static_cast<std::size_t>(align);
  if (void* p = std::aligned_alloc(a, (size + a - 1) / a * a)) return p;
  throw std::bad_alloc{};
}
}  // namespace

void* operator new(std::size_t size) { return counted_alloc(size); }
void* operator new[](std::size_t size) { return counted_alloc(size); }
void* operator new(std::size_t size, std::align_val_t align) { return counted_aligned_alloc(size, align); }
void* operator new[](std::size_t size, std::align_val_t align) { return counted_aligned_alloc(size, align); }
// The nothrow forms too: the sanitizers' runtimes define their own, whose
// memory this file's operator delete would then free with the wrong kind.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  if (fails_now()) return nullptr;
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  if (fails_now()) return nullptr;
  return std::malloc(size == 0 ? 1 : size);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
