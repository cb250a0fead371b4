// gpu/cuda_device_memory.h's promises, against tests/tools/sim_cudart.c (GRANARY_CUDART, set by
// ctest): copies that continue each other leave as one DMA, handed over by 8 MiB or at Wait, and
// a copy CUDA refuses fails its Wait and every copy call until then.
#include "gpu/cuda_device_memory.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace granary::gpu {
namespace {

constexpr uint64_t MiB = uint64_t{1} << 20;

class CudaDeviceMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* path = std::getenv("GRANARY_CUDART");
    ASSERT_NE(path, nullptr) << "run through ctest, which names the stand-in runtime";
    ASSERT_TRUE(cuda_.available()) << cuda_.why_not();
    void* sim = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(sim, nullptr) << "the runtime loaded is not " << path;
    async_copies_ = reinterpret_cast<long (*)()>(dlsym(sim, "sim_async_copies"));
    fail_copies_ = reinterpret_cast<void (*)(int)>(dlsym(sim, "sim_fail_copies_to_device"));
    ASSERT_NE(async_copies_, nullptr);
    ASSERT_NE(fail_copies_, nullptr);
    auto device = cuda_.AllocateDevice(kSize);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = static_cast<std::byte*>(*device);
    host_.resize(kSize);
    for (size_t i = 0; i < kSize; ++i) host_[i] = std::byte(i * 7 + i / 4096);
  }
  void TearDown() override { cuda_.FreeDevice(device_); }

  // The device's bytes [offset, offset + n), read back through the runtime.
  std::vector<std::byte> OnDevice(uint64_t offset, uint64_t n) {
    std::vector<std::byte> out(n);
    EXPECT_TRUE(cuda_.CopyToHost(out.data(), device_ + offset, n).ok());
    return out;
  }
  bool DeviceHolds(uint64_t offset, uint64_t n) {
    return std::memcmp(OnDevice(offset, n).data(), host_.data() + offset, n) == 0;
  }

  static constexpr uint64_t kSize = 16 * MiB;
  const CudaRuntime& cuda_ = CudaRuntime::Instance();
  std::byte* device_ = nullptr;
  std::vector<std::byte> host_;
  // The allocation's two halves are two ranges, as two registrations back to back would be.
  CudaDeviceMemory memory_{cuda_, [this](const std::byte* p, uint64_t n) {
                             const std::byte* half = device_ + kSize / 2;
                             const bool low = p >= device_ && p + n <= half;
                             const bool high = p >= half && p + n <= device_ + kSize;
                             return low || high ? 0 : -1;
                           }};
  long (*async_copies_)() = nullptr;
  void (*fail_copies_)(int) = nullptr;
};

TEST_F(CudaDeviceMemoryTest, CopiesThatContinueEachOtherLeaveAsOneDma) {
  const long before = async_copies_();
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(memory_.CopyIn(device_ + i * 64 * 1024, host_.data() + i * 64 * 1024, 64 * 1024).ok());
  }
  EXPECT_EQ(async_copies_() - before, 0) << "held until Wait";
  ASSERT_TRUE(memory_.Wait().ok());
  EXPECT_EQ(async_copies_() - before, 1);
  EXPECT_TRUE(DeviceHolds(0, 256 * 1024));
}

TEST_F(CudaDeviceMemoryTest, CopiesWithAGapOnEitherSideStaySeparate) {
  const long before = async_copies_();
  ASSERT_TRUE(memory_.CopyIn(device_, host_.data(), 4096).ok());
  ASSERT_TRUE(memory_.CopyIn(device_ + 8192, host_.data() + 8192, 4096).ok());  // a gap on both
  ASSERT_TRUE(memory_.CopyIn(device_ + 12288, host_.data() + 16384, 4096).ok());  // source gap
  ASSERT_TRUE(memory_.Wait().ok());
  EXPECT_EQ(async_copies_() - before, 3);
  EXPECT_TRUE(DeviceHolds(0, 4096));
  EXPECT_TRUE(DeviceHolds(8192, 4096));
  EXPECT_EQ(std::memcmp(OnDevice(12288, 4096).data(), host_.data() + 16384, 4096), 0);
}

TEST_F(CudaDeviceMemoryTest, CopiesIntoTwoRangesOfTheGpuStaySeparateThoughBackToBack) {
  const long before = async_copies_();
  const uint64_t half = kSize / 2;
  ASSERT_TRUE(memory_.CopyIn(device_ + half - 4096, host_.data() + half - 4096, 4096).ok());
  ASSERT_TRUE(memory_.CopyIn(device_ + half, host_.data() + half, 4096).ok());
  ASSERT_TRUE(memory_.Wait().ok());
  EXPECT_EQ(async_copies_() - before, 2);
  EXPECT_TRUE(DeviceHolds(half - 4096, 8192));
}

TEST_F(CudaDeviceMemoryTest, AMergedCopyIsHandedOverBy8MiBBeforeAnyWait) {
  const long before = async_copies_();
  for (uint64_t i = 0; i < 3; ++i) {  // the first two fill the low range exactly
    ASSERT_TRUE(memory_.CopyIn(device_ + i * 4 * MiB, host_.data() + i * 4 * MiB, 4 * MiB).ok());
  }
  EXPECT_EQ(async_copies_() - before, 1) << "the first 8 MiB left without waiting for Wait";
  ASSERT_TRUE(memory_.Wait().ok());
  EXPECT_EQ(async_copies_() - before, 2);
  EXPECT_TRUE(DeviceHolds(0, 12 * MiB));
}

TEST_F(CudaDeviceMemoryTest, CopiesOutMergeToo) {
  ASSERT_TRUE(cuda_.CopyToDevice(device_, host_.data(), MiB).ok());
  std::vector<std::byte> back(MiB);
  const long before = async_copies_();
  ASSERT_TRUE(memory_.CopyOut(back.data(), device_, MiB / 2).ok());
  ASSERT_TRUE(memory_.CopyOut(back.data() + MiB / 2, device_ + MiB / 2, MiB / 2).ok());
  ASSERT_TRUE(memory_.Wait().ok());
  EXPECT_EQ(async_copies_() - before, 1);
  EXPECT_EQ(std::memcmp(back.data(), host_.data(), MiB), 0);
}

TEST_F(CudaDeviceMemoryTest, ARefusedCopyFailsItsWaitAndEveryCopyCallUntilThen) {
  std::vector<std::byte> zeros(3 * 4096);
  ASSERT_TRUE(cuda_.CopyToDevice(device_, zeros.data(), zeros.size()).ok());
  fail_copies_(1);
  // Held, so accepted; refused when handed over, which the next copy with a gap does.
  EXPECT_TRUE(memory_.CopyIn(device_, host_.data(), 4096).ok());
  EXPECT_FALSE(memory_.CopyIn(device_ + 8192, host_.data() + 8192, 4096).ok());
  Status waited = memory_.Wait();
  EXPECT_FALSE(waited.ok()) << "a copy never made was reported done";
  EXPECT_EQ(waited.code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_EQ(OnDevice(0, 4096), std::vector<std::byte>(4096)) << "the refused copy's bytes";
  // The next Wait starts clean.
  fail_copies_(0);
  ASSERT_TRUE(memory_.CopyIn(device_, host_.data(), 4096).ok());
  EXPECT_TRUE(memory_.Wait().ok());
  EXPECT_TRUE(DeviceHolds(0, 4096));
}

TEST_F(CudaDeviceMemoryTest, ACopyRefusedAtWaitFailsThatWait) {
  fail_copies_(1);
  EXPECT_TRUE(memory_.CopyIn(device_, host_.data(), 4096).ok());
  EXPECT_FALSE(memory_.Wait().ok());
  fail_copies_(0);
  EXPECT_TRUE(memory_.Wait().ok());
}

}  // namespace
}  // namespace granary::gpu
