// The disk tier's building blocks: the I/O engines (io_uring and POSIX, the same tests), the
// staged writer, the record and bucket-metadata formats against torn and hostile bytes, and the
// offset backend's extent allocator against a shadow model.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <algorithm>
#include <random>
#include <thread>

#include "disk/disk_io.h"
#include "disk/extent_allocator.h"
#include "disk/record_format.h"
#include "disk/staged_writer.h"
#include "disk_test_util.h"

namespace granary::disk {
namespace {

using testing::TempDir;
using testing::ValueFor;

class DiskIoTest : public ::testing::TestWithParam<IoMode> {
 protected:
  void SetUp() override {
    auto io = MakeDiskIo(GetParam(), 32);
    ASSERT_TRUE(io.ok()) << io.status().ToString();
    io_ = std::move(*io);
    ASSERT_EQ(io_->mode(), GetParam());
    fd_ = ::open((dir_.path() + "/f").c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }
  TempDir dir_;
  std::unique_ptr<DiskIo> io_;
  int fd_ = -1;
};

TEST_P(DiskIoTest, ManyWritesThenManyReadsInOneBatch) {
  constexpr int kCount = 100;  // more than the queue depth: the engine refills as requests finish
  constexpr size_t kSize = 64 << 10;
  AlignedBuffer out(kCount * kSize), in(kCount * kSize);
  auto pattern = ValueFor("io", 1, kCount * kSize);
  std::memcpy(out.data(), pattern.data(), pattern.size());
  std::vector<IoRequest> writes(kCount), reads(kCount);
  for (int i = 0; i < kCount; ++i) {
    // Out of order on purpose: request i goes to slot (i * 37) % kCount.
    const uint64_t slot = (i * 37) % kCount;
    writes[i] = IoRequest{fd_, true, out.data() + slot * kSize, kSize, slot * kSize, 0};
    reads[i] = IoRequest{fd_, false, in.data() + slot * kSize, kSize, slot * kSize, 0};
  }
  io_->Run(writes);
  for (auto& w : writes) ASSERT_EQ(w.result, static_cast<int64_t>(kSize));
  io_->Run(reads);
  for (auto& r : reads) ASSERT_EQ(r.result, static_cast<int64_t>(kSize));
  EXPECT_EQ(0, std::memcmp(in.data(), pattern.data(), pattern.size()));
}

TEST_P(DiskIoTest, ShortCountsAtEndOfFileAndErrnoOnBadRequests) {
  AlignedBuffer buf(3 * 4096);
  IoRequest w{fd_, true, buf.data(), 8192, 0, 0};
  io_->Run(std::span(&w, 1));
  ASSERT_EQ(w.result, 8192);
  std::vector<IoRequest> reqs = {
      {fd_, false, buf.data(), 12288, 0, 0},      // past the end: short
      {fd_, false, buf.data(), 4096, 1 << 20, 0},  // wholly past the end: 0
      {-1, false, buf.data(), 4096, 0, 0},          // bad descriptor
      {fd_, false, buf.data() + 1, 4096, 0, 0},     // unaligned buffer on an O_DIRECT file
  };
  io_->Run(reqs);
  EXPECT_EQ(reqs[0].result, 8192);
  EXPECT_EQ(reqs[1].result, 0);
  EXPECT_EQ(reqs[2].result, -EBADF);
  EXPECT_EQ(reqs[3].result, -EINVAL);
  io_->Run({});  // an empty batch is fine
}

TEST_P(DiskIoTest, StagingIsPerThreadAlignedAndUsable) {
  auto staging = io_->Staging();
  ASSERT_EQ(staging.size(), kStagingBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(staging.data()) % kBlockSize, 0u);
  EXPECT_EQ(io_->Staging().data(), staging.data()) << "the same area for the same thread";
  std::byte* other = nullptr;
  std::thread([&] { other = io_->Staging().data(); }).join();
  EXPECT_NE(other, staging.data());
  // Requests inside the staging area (fixed buffers under io_uring) move bytes like any other.
  std::memset(staging.data(), 0x5A, 1 << 20);
  IoRequest w{fd_, true, staging.data(), 1 << 20, 0, 0};
  io_->Run(std::span(&w, 1));
  ASSERT_EQ(w.result, 1 << 20);
  std::memset(staging.data(), 0, 1 << 20);
  IoRequest r{fd_, false, staging.data() + (1 << 20), 1 << 20, 0, 0};
  io_->Run(std::span(&r, 1));
  ASSERT_EQ(r.result, 1 << 20);
  EXPECT_EQ(staging[(1 << 20) + 12345], std::byte{0x5A});
}

TEST_P(DiskIoTest, ThreadsRunBatchesAtOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      AlignedBuffer buf(256 << 10), back(256 << 10);
      auto pattern = ValueFor("thread", t, buf.size());
      std::memcpy(buf.data(), pattern.data(), pattern.size());
      for (int round = 0; round < 10; ++round) {
        const uint64_t off = (t * 10 + round) * buf.size();
        IoRequest w{fd_, true, buf.data(), buf.size(), off, 0};
        io_->Run(std::span(&w, 1));
        IoRequest r{fd_, false, back.data(), back.size(), off, 0};
        io_->Run(std::span(&r, 1));
        if (w.result != static_cast<int64_t>(buf.size()) || r.result != w.result ||
            std::memcmp(buf.data(), back.data(), buf.size()) != 0) {
          ++bad;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(DiskIoTest, StagedWriterPadsGathersAndReportsFailuresByTag) {
  StagedWriter writer(*io_);
  ASSERT_TRUE(writer.ok());
  auto big = ValueFor("big", 1, kStagingBytes + 12345);  // more than the staging area: drains midway
  auto small = ValueFor("small", 1, 100);
  writer.Put(fd_, 0, big, 1);
  const uint64_t small_at = AlignUp(big.size());
  writer.Put(fd_, small_at, small, 2);
  writer.Put(-1, 0, small, 3);  // a bad descriptor fails only its own tag
  auto failures = writer.Flush();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures.begin()->first, 3u);
  EXPECT_EQ(failures.begin()->second, EBADF);
  AlignedBuffer back(small_at + 4096);
  IoRequest r{fd_, false, back.data(), back.size(), 0, 0};
  io_->Run(std::span(&r, 1));
  ASSERT_EQ(r.result, static_cast<int64_t>(back.size())) << "the small value was padded to a block";
  EXPECT_EQ(0, std::memcmp(back.data(), big.data(), big.size()));
  EXPECT_EQ(0, std::memcmp(back.data() + small_at, small.data(), small.size()));
  for (size_t i = big.size(); i < small_at; ++i) ASSERT_EQ(back.data()[i], std::byte{0}) << "zero padding";
  for (size_t i = small_at + small.size(); i < back.size(); ++i) ASSERT_EQ(back.data()[i], std::byte{0});
}

INSTANTIATE_TEST_SUITE_P(Disk, DiskIoTest, ::testing::Values(IoMode::kUring, IoMode::kPosix),
                         [](const auto& info) { return std::string(info.param == IoMode::kUring ? "uring" : "posix"); });

TEST(DiskIoModeTest, FactoryAndNames) {
  EXPECT_TRUE(UringUsable()) << "this machine allows io_uring (kernel " << "see uname)";
  EXPECT_EQ(MakeDiskIo(IoMode::kAuto).value()->mode(), UringUsable() ? IoMode::kUring : IoMode::kPosix);
  EXPECT_EQ(MakeDiskIo(IoMode::kPosix, 0).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(MakeDiskIo(IoMode::kPosix, 257).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(*ParseIoMode("io_uring"), IoMode::kUring);
  EXPECT_EQ(*ParseIoMode("posix"), IoMode::kPosix);
  EXPECT_EQ(ParseIoMode("aio").code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(IoModeName(IoMode::kUring), "io_uring");
}

// --- formats -----------------------------------------------------------------------------------

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

TEST(DiskFormatTest, RecordHeaderRoundTripsAndRefusesEveryDamagedByte) {
  RecordHeader h{0, 12345, 7, 0xABCDEF, 42};
  const std::string key = "model/prefix-hash";
  std::string prefix = EncodeRecordPrefix(h, key, 99);
  ASSERT_EQ(prefix.size(), kRecordHeaderBytes + key.size());
  std::string decoded_key;
  auto back = DecodeRecordPrefix(Bytes(prefix), 99, &decoded_key);
  ASSERT_TRUE(back);
  EXPECT_EQ(decoded_key, key);
  EXPECT_EQ(back->value_len, 12345u);
  EXPECT_EQ(back->gen, 7u);
  EXPECT_EQ(back->value_checksum, 0xABCDEFu);
  EXPECT_EQ(back->unit_id, 42u);
  EXPECT_EQ(RecordPrefixBytes(static_cast<uint32_t>(key.size())), 4096u);
  EXPECT_EQ(RecordPrefixBytes(4096), 8192u);
  EXPECT_FALSE(DecodeRecordPrefix(Bytes(prefix), 98, &decoded_key)) << "another store's salt";
  for (size_t i = 0; i < prefix.size(); ++i) {
    std::string damaged = prefix;
    damaged[i] ^= 0x01;
    EXPECT_FALSE(DecodeRecordPrefix(Bytes(damaged), 99, &decoded_key)) << "byte " << i;
  }
  for (size_t n = 0; n < prefix.size(); ++n) {
    EXPECT_FALSE(DecodeRecordPrefix(Bytes(prefix.substr(0, n)), 99, &decoded_key)) << "torn at " << n;
  }
}

TEST(DiskFormatTest, BucketMetaRoundTripsAndRefusesDamage) {
  BucketMeta meta;
  meta.bucket_id = 5;
  meta.data_bytes = 3 * 65536;
  for (int i = 0; i < 3; ++i) {
    meta.entries.push_back(BucketEntry{"k" + std::to_string(i), 1, uint64_t(i) * 65536, 65536 - 7, 1234u + i});
  }
  std::string encoded = EncodeBucketMeta(meta, 3);
  auto back = DecodeBucketMeta(Bytes(encoded), 3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->entries.size(), 3u);
  EXPECT_EQ(back->entries[2].key, "k2");
  EXPECT_EQ(back->entries[2].offset, 2u * 65536);
  EXPECT_EQ(back->entries[1].checksum, 1235u);
  for (size_t i = 0; i < encoded.size(); ++i) {
    std::string damaged = encoded;
    damaged[i] ^= 0x10;
    EXPECT_FALSE(DecodeBucketMeta(Bytes(damaged), 3).ok()) << "byte " << i;
  }
  for (size_t n = 0; n < encoded.size(); ++n) {
    EXPECT_FALSE(DecodeBucketMeta(Bytes(encoded.substr(0, n)), 3).ok()) << "torn at " << n;
  }
  // Consistent checksums but lying contents (as a hostile writer with the salt could make).
  auto refuse = [](BucketMeta m) { return DecodeBucketMeta(Bytes(EncodeBucketMeta(m, 3)), 3); };
  BucketMeta outside = meta;
  outside.entries[2].offset = meta.data_bytes;
  EXPECT_EQ(refuse(outside).code(), ErrorCode::INVALID_READ);
  BucketMeta overlapping = meta;
  overlapping.entries[1].offset = 4096;
  EXPECT_EQ(refuse(overlapping).code(), ErrorCode::INVALID_READ);
  BucketMeta huge = meta;
  huge.entries[0].size = UINT64_MAX;
  EXPECT_EQ(refuse(huge).code(), ErrorCode::INVALID_READ);
  BucketMeta unaligned = meta;
  unaligned.entries[1].offset = 65537;
  EXPECT_EQ(refuse(unaligned).code(), ErrorCode::INVALID_READ);
}

TEST(DiskFormatTest, TombstoneRoundTripsAndRefusesEveryDamagedByte) {
  const Tombstone t{0x123456789, 77, 9, TombstoneKeyHash("model/prefix-hash", 5)};
  const std::string encoded = EncodeTombstone(t, 5);
  ASSERT_EQ(encoded.size(), kTombstoneBytes);
  auto back = DecodeTombstone(Bytes(encoded), 5);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->bucket_id, t.bucket_id);
  EXPECT_EQ(back->slot, 77u);
  EXPECT_EQ(back->gen, 9u);
  EXPECT_EQ(back->key_hash, t.key_hash);
  EXPECT_NE(TombstoneKeyHash("model/prefix-hash", 6), t.key_hash) << "the key hash is salted";
  EXPECT_NE(TombstoneKeyHash("model/prefix-hasi", 5), t.key_hash);
  EXPECT_FALSE(DecodeTombstone(Bytes(encoded), 4)) << "another store's salt";
  for (size_t i = 0; i < encoded.size(); ++i) {
    std::string damaged = encoded;
    damaged[i] ^= 0x01;
    EXPECT_FALSE(DecodeTombstone(Bytes(damaged), 5)) << "byte " << i;
  }
  for (size_t n = 0; n < encoded.size(); ++n) {
    EXPECT_FALSE(DecodeTombstone(Bytes(encoded.substr(0, n)), 5)) << "torn at " << n;
  }
  EXPECT_FALSE(DecodeTombstone(Bytes(std::string(kTombstoneBytes, '\0')), 5)) << "zeros";
}

TEST(DiskFormatTest, RandomBytesNeverDecode) {
  std::mt19937_64 rng(7);
  std::string key;
  for (int i = 0; i < 2000; ++i) {
    std::string junk(static_cast<size_t>(rng() % 9000), '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    if (i % 2 && junk.size() >= 12) {  // right magic and version, the rest junk
      const uint32_t magic = kRecordMagic;
      std::memcpy(junk.data() + 8, &magic, 4);
      junk[12] = 1;
      junk[13] = 0;
    }
    EXPECT_FALSE(DecodeRecordPrefix(Bytes(junk), 1, &key));
    EXPECT_FALSE(DecodeBucketMeta(Bytes(junk), 1).ok());
    EXPECT_FALSE(DecodeTombstone(Bytes(junk), 1));
  }
}

// --- extent allocator ------------------------------------------------------------------------------

TEST(DiskExtentAllocatorTest, BestFitSplitCoalesceAndReserve) {
  ExtentAllocator a(1 << 20);
  EXPECT_EQ(a.capacity(), 1u << 20);
  auto x = a.Allocate(4096), y = a.Allocate(8192), z = a.Allocate(4096);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 4096u);
  EXPECT_EQ(*z, 12288u);
  EXPECT_FALSE(a.Allocate(0));
  EXPECT_FALSE(a.Allocate(100)) << "sizes are whole blocks";
  EXPECT_FALSE(a.Allocate(2 << 20));
  ASSERT_TRUE(a.Free(*y, 8192));
  EXPECT_FALSE(a.Free(*y, 8192)) << "double free refused";
  EXPECT_FALSE(a.Free(*y, 4096)) << "overlapping free space refused";
  // Best fit: a 4 KiB request takes from the 8 KiB hole, not the big tail.
  auto w = a.Allocate(4096);
  ASSERT_TRUE(w);
  EXPECT_EQ(*w, 4096u);
  ASSERT_TRUE(a.Free(*x, 4096));
  ASSERT_TRUE(a.Free(*w, 4096));
  ASSERT_TRUE(a.Free(*z, 4096));
  EXPECT_EQ(a.free_ranges(), 1u) << "neighbours merge back into one range";
  EXPECT_EQ(a.free_bytes(), 1u << 20);
  EXPECT_TRUE(a.Reserve(65536, 8192));
  EXPECT_FALSE(a.Reserve(65536, 4096)) << "already used";
  EXPECT_FALSE(a.Reserve(1 << 20, 4096)) << "outside";
  EXPECT_EQ(a.free_bytes(), (1u << 20) - 8192);
  EXPECT_EQ(a.largest_free(), (1u << 20) - 65536 - 8192);
  EXPECT_FALSE(a.Free(UINT64_MAX - 4095, 4096));
}

TEST(DiskExtentAllocatorTest, MatchesAShadowModelUnderRandomTraffic) {
  const uint64_t capacity = 64 << 20;
  ExtentAllocator a(capacity);
  std::map<uint64_t, uint64_t> live;  // offset -> bytes
  std::mt19937_64 rng(11);
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 3) {
      uint64_t bytes = (1 + rng() % 64) * 4096;
      auto got = a.Allocate(bytes);
      if (!got) continue;
      auto next = live.lower_bound(*got);
      ASSERT_TRUE(next == live.end() || next->first >= *got + bytes) << "overlaps a live range";
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *got) << "overlaps a live range";
      }
      ASSERT_LE(*got + bytes, capacity);
      live[*got] = bytes;
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      ASSERT_TRUE(a.Free(it->first, it->second));
      live.erase(it);
    }
    uint64_t used = 0;
    for (auto& [o, b] : live) used += b;
    ASSERT_EQ(a.free_bytes(), capacity - used);
  }
  for (auto& [o, b] : live) ASSERT_TRUE(a.Free(o, b));
  EXPECT_EQ(a.free_ranges(), 1u);
}

// Recovery reserves records in index order, not file order, and can leave thousands of gaps of
// one length: each must stay findable, the smallest offset of a length first, and merge back.
TEST(DiskExtentAllocatorTest, ManyRangesOfOneLengthAllocateLowestFirstAndMergeBack) {
  const uint64_t slot = 3 * 4096;  // a 2-block record and a 1-block gap, 4000 times
  const uint64_t slots = 4000;
  ExtentAllocator a(slots * slot);
  std::vector<uint64_t> order(slots);
  for (uint64_t i = 0; i < slots; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(5));
  for (uint64_t i : order) ASSERT_TRUE(a.Reserve(i * slot, 2 * 4096)) << i;
  EXPECT_EQ(a.free_ranges(), slots);
  EXPECT_EQ(a.largest_free(), 4096u);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(a.Allocate(4096), i * slot + 2 * 4096);
  EXPECT_FALSE(a.Allocate(8192)) << "no two free blocks touch";
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(a.Free(i * slot + 2 * 4096, 4096));
  for (uint64_t i : order) ASSERT_TRUE(a.Free(i * slot, 2 * 4096)) << i;
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.free_bytes(), slots * slot);
}

}  // namespace
}  // namespace granary::disk
