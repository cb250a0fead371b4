// master/codec/binary_codec.h - the byte format of the master's ordered history and snapshots.
//
// Promise: one description per record type serves both directions: a `Fields(io, record)`
// function names the fields in order, and io is an Encoder (appends them) or a Decoder (fills
// them). Integers are LEB128 varints (signed ones zigzagged), strings and vectors are a count and
// then their contents. A Decoder never reads past its input and never allocates more than the
// input could describe: a truncated or hostile record makes ok() false and leaves zeros, never a
// crash. Decoding what Encode wrote gives back equal records.
// Ownership: an Encoder owns its bytes (take them with Take()); a Decoder views bytes the caller
// keeps alive.
// Thread safety: none; one thread per Encoder/Decoder.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/inline_vector.h"
#include "common/rare_optional.h"
#include "common/rare_vector.h"

namespace granary::master {

// std::optional and RareOptional fields, and any type that says it behaves as one (a member type
// OptionalFieldTag): a presence byte, then the value. All encode to the same bytes, so a field may
// move between them without a format change.
template <typename O>
struct IsOptionalField : std::false_type {};
template <typename T>
struct IsOptionalField<std::optional<T>> : std::true_type {};
template <typename T>
struct IsOptionalField<RareOptional<T>> : std::true_type {};
template <typename O>
  requires requires { typename O::OptionalFieldTag; }
struct IsOptionalField<O> : std::true_type {};
template <typename O>
concept OptionalField = IsOptionalField<O>::value;

// std::vector, RareVector and InlineVector fields: a count, then the items. All three encode to
// the same bytes, so a field may move between them without a format change.
template <typename V>
struct IsVectorField : std::false_type {};
template <typename T>
struct IsVectorField<std::vector<T>> : std::true_type {};
template <typename T>
struct IsVectorField<RareVector<T>> : std::true_type {};
template <typename T>
struct IsVectorField<InlineVector<T>> : std::true_type {};
template <typename V>
concept VectorField = IsVectorField<V>::value;

class Encoder {
 public:
  static constexpr bool kDecoding = false;

  void operator()(uint64_t& v) { PutVarint(v); }
  void operator()(uint32_t& v) { PutVarint(v); }
  void operator()(uint8_t& v) { PutVarint(v); }
  void operator()(int64_t& v) { PutVarint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63)); }
  void operator()(bool& v) { out_.push_back(v ? 1 : 0); }
  void operator()(double& v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    PutFixed64(bits);
  }
  void operator()(std::string& v) {
    PutVarint(v.size());
    out_.append(v);
  }
  template <VectorField V>
  void operator()(V& v) {
    PutVarint(v.size());
    for (auto& item : v) (*this)(item);
  }
  template <OptionalField O>
  void operator()(O& v) {
    bool present = v.has_value();
    (*this)(present);
    if (present) (*this)(*v);
  }
  // Any record type with a Fields(io, record) overload.
  template <typename T>
  auto operator()(T& record) -> decltype(Fields(*this, record), void()) {
    Fields(*this, record);
  }
  void Raw(std::string_view bytes) { out_.append(bytes); }
  void PutFixed64(uint64_t v) {
    char b[8];
    std::memcpy(b, &v, 8);
    out_.append(b, 8);
  }

  const std::string& bytes() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void PutVarint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

class Decoder {
 public:
  static constexpr bool kDecoding = true;

  explicit Decoder(std::string_view in) : in_(in) {}

  void operator()(uint64_t& v) { v = GetVarint(); }
  void operator()(uint32_t& v) { v = Narrow<uint32_t>(GetVarint()); }
  void operator()(uint8_t& v) { v = Narrow<uint8_t>(GetVarint()); }
  void operator()(int64_t& v) {
    uint64_t z = GetVarint();
    v = static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1));
  }
  void operator()(bool& v) {
    uint8_t b = 0;
    if (!Need(1)) return;
    b = static_cast<uint8_t>(in_[pos_++]);
    if (b > 1) Fail();
    v = b == 1;
  }
  void operator()(double& v) {
    uint64_t bits = GetFixed64();
    std::memcpy(&v, &bits, sizeof(v));
  }
  void operator()(std::string& v) {
    uint64_t n = GetVarint();
    if (!Need(n)) return;
    v.assign(in_.substr(pos_, n));
    pos_ += n;
  }
  template <VectorField V>
  void operator()(V& v) {
    uint64_t n = GetVarint();
    // Every element takes at least one byte: a count beyond what is left is a lie.
    if (n > in_.size() - pos_ || n > v.max_size()) {
      Fail();
      return;
    }
    v.clear();
    v.resize(n);
    for (auto& item : v) {
      (*this)(item);
      if (!ok_) return;
    }
  }
  template <OptionalField O>
  void operator()(O& v) {
    bool present = false;
    (*this)(present);
    v.reset();
    if (present && ok_) {
      v.emplace();
      (*this)(*v);
    }
  }
  template <typename T>
  auto operator()(T& record) -> decltype(Fields(*this, record), void()) {
    Fields(*this, record);
  }
  uint64_t GetFixed64() {
    uint64_t v = 0;
    if (!Need(8)) return 0;
    std::memcpy(&v, in_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }

  bool ok() const { return ok_; }
  bool done() const { return pos_ == in_.size(); }
  void Fail() { ok_ = false; pos_ = in_.size(); }

 private:
  bool Need(uint64_t n) {
    if (!ok_ || n > in_.size() - pos_) {
      Fail();
      return false;
    }
    return true;
  }
  uint64_t GetVarint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (!Need(1)) return 0;
      uint8_t b = static_cast<uint8_t>(in_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    Fail();
    return 0;
  }
  template <typename T>
  T Narrow(uint64_t v) {
    if (v > static_cast<uint64_t>(static_cast<T>(~T{0}))) Fail();
    return static_cast<T>(v);
  }

  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace granary::master
