// A test segment between guard bytes (the data plane's tests, data_server_fixture.h and
// capability_test.cc): a DataServer is handed data(), and after every test the guards must be
// intact, since no request, however hostile, may make the server write outside its segment.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace granary::testing {

class GuardedSegment {
 public:
  static constexpr uint64_t kGuard = 4096;
  static constexpr uint8_t kGuardByte = 0xA5;

  // `size` bytes, byte i holding i * mul + add (mod 256), a guard on each side.
  GuardedSegment(uint64_t size, uint8_t mul, uint8_t add)
      : size_(size), memory_(kGuard + size + kGuard, kGuardByte) {
    for (uint64_t i = 0; i < size; ++i) data()[i] = static_cast<uint8_t>(i * mul + add);
  }
  uint8_t* data() { return memory_.data() + kGuard; }

  // The canary, checked in TearDown: a fatal failure names the first byte hit.
  void AssertGuardsIntact() const {
    for (uint64_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(memory_[i], kGuardByte) << "guard before the segment hit at " << i;
      ASSERT_EQ(memory_[kGuard + size_ + i], kGuardByte) << "guard after the segment hit at " << i;
    }
  }

 private:
  uint64_t size_;
  std::vector<uint8_t> memory_;
};

}  // namespace granary::testing
