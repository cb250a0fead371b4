// common/inline_vector.h - a vector that holds its first element inline, for a list that almost
// always has exactly one element (a version's memory replicas): one element costs no allocation,
// where a std::vector pays 24 bytes plus a heap block.
//
// Promise: behaves as std::vector<T> for the calls it offers: elements are contiguous and in
// order, copies copy them, moves leave the source empty. At most one element lives inline; a
// second moves them all to the heap, and the call that brings the size back to one or zero
// brings the list back inline and frees the heap block. Iterators are plain pointers; any change
// of size may invalidate them, as with std::vector. Only for trivially copyable T: elements are
// moved by memcpy.
// Ownership: owns the elements. Thread safety: as a plain value (the caller synchronises).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace granary {

template <typename T>
class InlineVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  InlineVector() {}
  InlineVector(std::initializer_list<T> init) { Assign(init.begin(), init.size()); }
  explicit InlineVector(const std::vector<T>& items) { Assign(items.data(), items.size()); }
  InlineVector(const InlineVector& other) { Assign(other.data(), other.size_); }
  InlineVector(InlineVector&& other) noexcept { Steal(other); }
  InlineVector& operator=(const InlineVector& other) {
    if (this != &other) {
      Release();
      Assign(other.data(), other.size_);
    }
    return *this;
  }
  InlineVector& operator=(InlineVector&& other) noexcept {
    if (this != &other) {
      Release();
      Steal(other);
    }
    return *this;
  }
  ~InlineVector() { Release(); }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  static constexpr size_t max_size() { return UINT32_MAX; }  // the count is 32 bits
  T* data() { return capacity_ ? heap_ : &one_; }
  const T* data() const { return capacity_ ? heap_ : &one_; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void push_back(const T& value) {
    if (size_ == 0 && capacity_ == 0) {
      one_ = value;
      size_ = 1;
      return;
    }
    const T copy = value;  // value may live in this list, which Grow moves
    if (size_ == max_size()) throw std::length_error("InlineVector past 2^32 - 1 elements");
    if (size_ >= Capacity()) {
      Grow(std::min<size_t>(max_size(), std::max<size_t>(4, size_ * size_t{2})));
    }
    heap_[size_++] = copy;
  }
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    push_back(T{std::forward<Args>(args)...});
    return back();
  }
  // As std::vector::erase; the returned iterator points at the element after the last erased.
  T* erase(const T* first, const T* last) {
    const size_t from = static_cast<size_t>(first - data());
    const size_t to = static_cast<size_t>(last - data());
    if (from == to) return data() + from;
    T* d = data();
    std::memmove(static_cast<void*>(d + from), d + to, (size_ - to) * sizeof(T));
    size_ -= static_cast<uint32_t>(to - from);
    ShrinkInline();
    return data() + from;
  }
  T* erase(const T* position) { return erase(position, position + 1); }
  void clear() {
    Release();
    size_ = 0;
  }
  void resize(size_t n) {
    if (n > max_size()) throw std::length_error("InlineVector past 2^32 - 1 elements");
    if (n > Capacity()) Grow(n);
    for (size_t i = size_; i < n; ++i) data()[i] = T{};
    size_ = static_cast<uint32_t>(n);
    ShrinkInline();
  }
  std::vector<T> ToVector() const { return std::vector<T>(begin(), end()); }

  friend bool operator==(const InlineVector& a, const InlineVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  // As std::erase_if: removes what `pred` selects, returns how many.
  template <typename Pred>
  friend size_t erase_if(InlineVector& v, Pred pred) {
    const size_t before = v.size();
    v.erase(std::remove_if(v.begin(), v.end(), pred), v.end());
    return before - v.size();
  }

 private:
  size_t Capacity() const { return capacity_ ? capacity_ : 1; }
  void Assign(const T* items, size_t n) {
    if (n > max_size()) throw std::length_error("InlineVector past 2^32 - 1 elements");
    size_ = 0;
    capacity_ = 0;
    if (n == 1) {
      one_ = items[0];
    } else if (n > 1) {
      Grow(n);
      std::memcpy(static_cast<void*>(heap_), items, n * sizeof(T));
    }
    size_ = static_cast<uint32_t>(n);
  }
  void Steal(InlineVector& other) {
    size_ = other.size_;
    capacity_ = other.capacity_;
    if (capacity_) {
      heap_ = other.heap_;
    } else if (size_) {
      one_ = other.one_;
    }
    other.size_ = 0;
    other.capacity_ = 0;
  }
  void Grow(size_t capacity) {
    T* grown = static_cast<T*>(::operator new(capacity * sizeof(T)));
    if (size_ > 0) std::memcpy(static_cast<void*>(grown), data(), size_ * sizeof(T));
    Release();
    heap_ = grown;
    capacity_ = static_cast<uint32_t>(capacity);
  }
  // Back inline at one element or none.
  void ShrinkInline() {
    if (capacity_ == 0 || size_ > 1) return;
    T* heap = heap_;
    if (size_ == 1) one_ = heap[0];  // a trivial assignment makes one_ the live member
    ::operator delete(heap);
    capacity_ = 0;
  }
  void Release() {
    if (capacity_) ::operator delete(heap_);
    capacity_ = 0;
  }

  union {
    T one_;    // capacity_ == 0: the element, if size_ == 1
    T* heap_;  // capacity_ > 0: capacity_ elements on the heap
  };
  uint32_t size_ = 0;
  uint32_t capacity_ = 0;
};

}  // namespace granary
