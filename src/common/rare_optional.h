// common/rare_optional.h - an optional value kept out of line, for a field that most objects of a
// large table never have: empty, it costs one pointer instead of sizeof(T).
//
// Promise: behaves as std::optional<T> for the calls it offers (a value or none; copies copy the
// value; moves leave the source empty), so a std::optional member can become one without its
// users changing. A held value lives in its own heap allocation; assigning a value
// reuses it (emplace makes a new one).
// Ownership: owns the value. Thread safety: as a plain value (the caller synchronises).
#pragma once

#include <memory>
#include <optional>
#include <utility>

namespace granary {

template <typename T>
class RareOptional {
 public:
  RareOptional() = default;
  RareOptional(std::nullopt_t) {}  // NOLINT: as std::optional
  RareOptional(T value) : value_(std::make_unique<T>(std::move(value))) {}  // NOLINT: as above
  RareOptional(const RareOptional& other)
      : value_(other.value_ ? std::make_unique<T>(*other.value_) : nullptr) {}
  RareOptional(RareOptional&& other) noexcept = default;
  RareOptional& operator=(const RareOptional& other) {
    if (this == &other) return *this;
    if (!other.value_) {
      value_.reset();
    } else {
      *this = T(*other.value_);
    }
    return *this;
  }
  RareOptional& operator=(RareOptional&& other) noexcept = default;
  RareOptional& operator=(std::nullopt_t) {
    value_.reset();
    return *this;
  }
  RareOptional& operator=(T value) {
    if (value_) {
      *value_ = std::move(value);
    } else {
      value_ = std::make_unique<T>(std::move(value));
    }
    return *this;
  }

  template <typename... Args>
  T& emplace(Args&&... args) {
    value_ = std::make_unique<T>(std::forward<Args>(args)...);
    return *value_;
  }
  void reset() { value_.reset(); }

  bool has_value() const { return value_ != nullptr; }
  explicit operator bool() const { return has_value(); }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return value_.get(); }
  const T* operator->() const { return value_.get(); }

 private:
  std::unique_ptr<T> value_;
};

}  // namespace granary
