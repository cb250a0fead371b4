// common/rare_vector.h - a vector kept out of line, for a list that most objects of a large table
// leave empty (an object's read locks, its disk copies): empty, it costs one pointer instead of
// the 24 bytes of a std::vector.
//
// Promise: behaves as std::vector<T> for the calls it offers: elements are contiguous and in
// order, copies copy them, moves leave the source empty. Empty always means no allocation: the
// call that removes the last element frees the list, so a table of emptied lists holds nothing.
// Iterators are plain pointers; any change of size may invalidate them, as with std::vector.
// Ownership: owns the elements. Thread safety: as a plain value (the caller synchronises).
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace granary {

template <typename T>
class RareVector {
 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  RareVector() = default;
  RareVector(std::initializer_list<T> init) {
    if (init.size() > 0) list_ = std::make_unique<std::vector<T>>(init);
  }
  explicit RareVector(std::vector<T> items) {
    if (!items.empty()) list_ = std::make_unique<std::vector<T>>(std::move(items));
  }
  RareVector(const RareVector& other)
      : list_(other.list_ ? std::make_unique<std::vector<T>>(*other.list_) : nullptr) {}
  RareVector(RareVector&& other) noexcept = default;
  RareVector& operator=(const RareVector& other) {
    if (this != &other) {
      list_ = other.list_ ? std::make_unique<std::vector<T>>(*other.list_) : nullptr;
    }
    return *this;
  }
  RareVector& operator=(RareVector&& other) noexcept = default;

  bool empty() const { return list_ == nullptr; }
  size_t size() const { return list_ ? list_->size() : 0; }
  size_t max_size() const { return std::vector<T>().max_size(); }
  T* data() { return list_ ? list_->data() : nullptr; }
  const T* data() const { return list_ ? list_->data() : nullptr; }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  T& operator[](size_t i) { return (*list_)[i]; }
  const T& operator[](size_t i) const { return (*list_)[i]; }
  T& front() { return list_->front(); }
  const T& front() const { return list_->front(); }
  T& back() { return list_->back(); }
  const T& back() const { return list_->back(); }

  void push_back(T value) { emplace_back(std::move(value)); }
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    if (list_) return list_->emplace_back(std::forward<Args>(args)...);
    auto first = std::make_unique<std::vector<T>>();  // kept only once it holds the element
    first->emplace_back(std::forward<Args>(args)...);
    list_ = std::move(first);
    return list_->back();
  }
  // As std::vector::erase; the returned iterator is end() when the list became empty.
  T* erase(const T* first, const T* last) {
    const size_t from = static_cast<size_t>(first - data());
    const size_t to = static_cast<size_t>(last - data());
    if (from == to) return data() + from;
    list_->erase(list_->begin() + from, list_->begin() + to);
    if (list_->empty()) {
      list_.reset();
      return nullptr;
    }
    return data() + from;
  }
  T* erase(const T* position) { return erase(position, position + 1); }
  void clear() { list_.reset(); }
  void resize(size_t n) {
    if (n == 0) {
      list_.reset();
      return;
    }
    if (list_) {
      list_->resize(n);
      return;
    }
    auto grown = std::make_unique<std::vector<T>>(n);
    list_ = std::move(grown);
  }
  std::vector<T> ToVector() const { return list_ ? *list_ : std::vector<T>{}; }

  friend bool operator==(const RareVector& a, const RareVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  // As std::erase_if: removes what `pred` selects, returns how many.
  template <typename Pred>
  friend size_t erase_if(RareVector& v, Pred pred) {
    const size_t before = v.size();
    v.erase(std::remove_if(v.begin(), v.end(), pred), v.end());
    return before - v.size();
  }

 private:
  std::unique_ptr<std::vector<T>> list_;  // null exactly when empty
};

}  // namespace granary
