// master/state/object_key.h - a key in one pointer, and the key block format the master's
// objects use: an ObjectTable entry keeps its key in the same format after its ObjectMeta, so
// ViewOfBlock reads both, and a KeyRefSet lists either by its block.
//
// Promise: holds a copy of the key's bytes (any length, any bytes) in one heap block after its
// length (a varint: one byte below 128, so for keys of 16-127 bytes the block is the size of a
// std::string's heap block, and one byte more beyond); compares, hashes and views as that
// std::string_view. Copies copy the bytes; moves hand the block over and leave the source empty
// (the empty key). The bytes never move: a view of them stays valid until the key that holds
// the block is destroyed or assigned to. 8 bytes where a std::string takes 32.
// Ownership: owns its block. Thread safety: as a plain value (the caller synchronises).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace granary::master {

class ObjectKey {
 public:
  ObjectKey() = default;
  explicit ObjectKey(std::string_view key) {
    if (key.empty()) return;
    block_ = static_cast<char*>(::operator new(BlockSize(key)));
    WriteBlock(block_, key);
  }
  ObjectKey(const ObjectKey& other) : ObjectKey(other.view()) {}
  ObjectKey(ObjectKey&& other) noexcept : block_(other.block_) { other.block_ = nullptr; }
  ObjectKey& operator=(const ObjectKey& other) {
    if (this != &other) *this = ObjectKey(other);
    return *this;
  }
  ObjectKey& operator=(ObjectKey&& other) noexcept {
    if (this != &other) {
      ::operator delete(block_);
      block_ = other.block_;
      other.block_ = nullptr;
    }
    return *this;
  }
  ~ObjectKey() { ::operator delete(block_); }

  std::string_view view() const { return block_ ? ViewOfBlock(block_) : std::string_view(); }
  // The block itself (null for the empty key), and the key a block holds: a KeyRefSet keeps
  // one pointer per entry and reads the key back through it.
  const char* block() const { return block_; }
  // The block format, for whoever keeps a key's block inside a block of its own (ObjectTable):
  // the bytes a block for `key` takes, and the block written at `out`.
  static size_t BlockSize(std::string_view key) {
    size_t prefix = 1;
    for (size_t n = key.size(); n >= 0x80; n >>= 7) ++prefix;
    return prefix + key.size();
  }
  static void WriteBlock(char* out, std::string_view key) {
    for (size_t n = key.size();; n >>= 7) {
      *out++ = static_cast<char>(n < 0x80 ? n : (n & 0x7F) | 0x80);
      if (n < 0x80) break;
    }
    std::memcpy(out, key.data(), key.size());
  }
  static std::string_view ViewOfBlock(const char* block) {
    size_t length = 0;
    const char* in = block;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(*in++);
      length |= static_cast<size_t>(b & 0x7F) << shift;
      if (b < 0x80) break;
    }
    return {in, length};
  }
  size_t size() const { return view().size(); }
  const char* data() const { return block_ ? view().data() : ""; }
  operator std::string_view() const { return view(); }  // NOLINT: a key reads as its bytes
  std::string str() const { return std::string(view()); }

  friend bool operator==(const ObjectKey& a, const ObjectKey& b) { return a.view() == b.view(); }
  friend bool operator==(const ObjectKey& a, std::string_view b) { return a.view() == b; }
  friend bool operator<(const ObjectKey& a, const ObjectKey& b) { return a.view() < b.view(); }

 private:
  char* block_ = nullptr;  // [length, LEB128][bytes]; null for the empty key
};

}  // namespace granary::master
