// File: transport/uring_tcp/detail/intrusive_list.hpp — a doubly linked
// list threaded through its elements (`prev`/`next` members), so queuing,
// matching and cancelling an operation never allocates.
#pragma once

#include <cstddef>

namespace pdcoll::transport::uring_tcp::detail {

/// FIFO of `T*` linked through `T::prev` / `T::next`; an element is in at
/// most one such list at a time. All operations are O(1) except size().
template <class T>
class intrusive_list {
 public:
  bool empty() const noexcept { return head_ == nullptr; }
  T* front() const noexcept { return head_; }

  void push_back(T* item) noexcept {
    item->next = nullptr;
    item->prev = tail_;
    if (tail_) tail_->next = item; else head_ = item;
    tail_ = item;
  }

  void erase(T* item) noexcept {
    if (item->prev) item->prev->next = item->next; else head_ = item->next;
    if (item->next) item->next->prev = item->prev; else tail_ = item->prev;
    item->prev = item->next = nullptr;
  }

  T* pop_front() noexcept {
    T* item = head_;
    if (item) erase(item);
    return item;
  }

  std::size_t size() const noexcept {
    std::size_t n = 0;
    for (T* it = head_; it; it = it->next) ++n;
    return n;
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
};

}  // namespace pdcoll::transport::uring_tcp::detail
