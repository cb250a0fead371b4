// Client::BatchGetIntoDevice and BatchPutFromDevice against real processes, with a DeviceMemory whose memory the CPU
// cannot touch: a memfd mapped PROT_NONE where the client sees it (a load or store there would
// kill the test) and read-write only inside this test's copy engine, as a GPU's would be.
// Checks the promises of granary/client.h: from a segment on this host the bytes are copied
// straight out of (or into) the mapping, which is registered once and unregistered before it is
// unmapped; over TCP and from a disk tier they come through host memory; a failed device copy
// fails its key; host and device parts mix; threads read at once.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;

// Device memory: `device()` is what the client is given, `shadow()` what only CopyIn writes.
class CopyEngineMemory final : public DeviceMemory {
 public:
  explicit CopyEngineMemory(size_t size) : size_(size) {
    int fd = memfd_create("granary-device-test", MFD_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    device_ = static_cast<std::byte*>(mmap(nullptr, size, PROT_NONE, MAP_SHARED, fd, 0));
    shadow_ = static_cast<std::byte*>(
        mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~CopyEngineMemory() override {
    munmap(device_, size_);
    munmap(shadow_, size_);
  }

  std::byte* device() const { return device_; }
  const std::byte* shadow() const { return shadow_; }
  std::byte* shadow() { return shadow_; }

  bool Holds(const std::byte* p, uint64_t n) const override {
    return p >= device_ && p + n <= device_ + size_;
  }
  Status CopyIn(std::byte* dst, const std::byte* src, uint64_t n) override {
    if (!Holds(dst, n)) return Status(ErrorCode::INVALID_PARAMS, "not device memory");
    if (Faulty()) return Status(ErrorCode::TRANSFER_FAIL, "copy engine fault");
    std::memcpy(shadow_ + (dst - device_), src, n);
    copied_ += n;
    if (InRegistered(src, n)) copied_from_registered_ += n;
    return Status::Ok();
  }
  Status CopyOut(std::byte* dst, const std::byte* src, uint64_t n) override {
    if (!Holds(src, n)) return Status(ErrorCode::INVALID_PARAMS, "not device memory");
    if (Faulty()) return Status(ErrorCode::TRANSFER_FAIL, "copy engine fault");
    std::memcpy(dst, shadow_ + (src - device_), n);
    copied_out_ += n;
    if (InRegistered(dst, n)) copied_into_registered_ += n;
    return Status::Ok();
  }
  Status Wait() override {
    ++waits_;
    // A copy engine that takes this long to finish what it was given.
    if (int ms = slow_wait_ms_.load(); ms > 0) std::this_thread::sleep_for(Millis(ms));
    return Status::Ok();
  }
  // The handle outlives this object when the client does (it lives as long as the client's
  // mapping): it refers to the shared bookkeeping, never to `this`.
  std::shared_ptr<void> Register(std::byte* base, uint64_t size) override {
    auto book = book_;
    std::lock_guard lock(book->mu);
    book->registered.push_back({base, size});
    ++book->live;
    return std::shared_ptr<void>(base, [book, size](void* p) {
      std::lock_guard lock(book->mu);
      unsigned char page = 0;
      if (mincore(p, 1, &page) != 0) ++book->unregistered_unmapped;  // must still be mapped
      for (auto it = book->registered.begin(); it != book->registered.end(); ++it) {
        if (it->first == p && it->second == size) {
          book->registered.erase(it);
          break;
        }
      }
      --book->live;
    });
  }

  bool InRegistered(const std::byte* p, uint64_t n) {
    std::lock_guard lock(book_->mu);
    for (const auto& [base, size] : book_->registered) {
      if (p >= base && p + n <= base + size) return true;
    }
    return false;
  }
  int live() const {
    std::lock_guard lock(book_->mu);
    return book_->live;
  }
  int unregistered_unmapped() const {
    std::lock_guard lock(book_->mu);
    return book_->unregistered_unmapped;
  }
  // The next n copies fail.
  void FailCopies(int n) { failing_ = n; }
  bool Faulty() {
    int left = failing_.load();
    while (left > 0 && !failing_.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  }

  std::atomic<uint64_t> copied_{0}, copied_from_registered_{0}, waits_{0};
  std::atomic<uint64_t> copied_out_{0}, copied_into_registered_{0};
  std::atomic<int> failing_{0};
  std::atomic<int> slow_wait_ms_{0};
  struct Registrations {
    mutable std::mutex mu;
    std::vector<std::pair<std::byte*, uint64_t>> registered;
    int live = 0;
    int unregistered_unmapped = 0;
  };
  std::shared_ptr<Registrations> book_ = std::make_shared<Registrations>();

 private:
  size_t size_;
  std::byte* device_;
  std::byte* shadow_;
};

class DeviceMemoryTest : public StoreTest {
 protected:
  void PutObjects(Client& writer, int count, const std::string& prefix) {
    for (int i = 0; i < count; ++i) {
      keys_.push_back(prefix + std::to_string(i));
      sizes_.push_back((i + 1) * 37 * KiB + 3 * i);
      total_ += sizes_.back();
      const Bytes value = testdata::Pattern(keys_.back(), sizes_.back());
      ASSERT_TRUE(writer.Put(keys_.back(), ByteSpan(value)).ok());
    }
  }
  // Every object into its own range of `mem`, back to back; checks the bytes that arrived.
  void GetAllIntoDevice(Client& client, CopyEngineMemory& mem, size_t base = 0) {
    std::vector<std::vector<MutableByteSpan>> dst;
    size_t offset = base;
    for (uint64_t n : sizes_) {
      dst.push_back({MutableByteSpan(mem.device() + offset, n)});
      offset += n;
    }
    auto got = client.BatchGetIntoDevice(keys_, dst, mem);
    offset = base;
    for (size_t i = 0; i < keys_.size(); ++i) {
      ASSERT_TRUE(got[i].ok()) << keys_[i] << ": " << got[i].status().ToString();
      EXPECT_EQ(*got[i], sizes_[i]);
      const Bytes want = testdata::Pattern(keys_[i], sizes_[i]);
      EXPECT_EQ(std::memcmp(mem.shadow() + offset, want.data(), sizes_[i]), 0) << keys_[i];
      offset += sizes_[i];
    }
  }

  std::vector<std::string> keys_;
  std::vector<uint64_t> sizes_;
  uint64_t total_ = 0;
};

TEST_F(DeviceMemoryTest, SameHostGetsAreCopiedStraightOutOfTheRegisteredSegment) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  auto client = cluster_.MakeClient(true);
  ASSERT_NE(client, nullptr);
  PutObjects(*client, 10, "dev/");
  CopyEngineMemory mem(16 * MiB);
  GetAllIntoDevice(*client, mem);
  EXPECT_EQ(mem.copied_.load(), total_);
  EXPECT_EQ(mem.copied_from_registered_.load(), total_) << "a copy did not read the segment";
  EXPECT_EQ(client->Stats().shm_bytes_read_by_device, total_);
  EXPECT_EQ(client->Stats().tcp_bytes_read, 0u);
  EXPECT_EQ(mem.live(), 1) << "one mapping, registered once";
  // Again: no second registration.
  GetAllIntoDevice(*client, mem, 4 * MiB);
  EXPECT_EQ(mem.live(), 1);
  // Host and device parts of one object, and a miss beside it.
  Bytes host(sizes_[3] - 1000);
  std::vector<std::vector<MutableByteSpan>> mixed = {
      {MutableByteSpan(mem.device() + 12 * MiB, 1000), MutableByteSpan(host)},
      {MutableByteSpan(mem.device() + 13 * MiB, 4096)}};
  auto got = client->BatchGetIntoDevice({keys_[3], "dev/missing"}, mixed, mem);
  ASSERT_TRUE(got[0].ok()) << got[0].status().ToString();
  EXPECT_EQ(got[1].status().code(), ErrorCode::OBJECT_NOT_FOUND);
  const Bytes want = testdata::Pattern(keys_[3], sizes_[3]);
  EXPECT_EQ(std::memcmp(mem.shadow() + 12 * MiB, want.data(), 1000), 0);
  EXPECT_EQ(std::memcmp(host.data(), want.data() + 1000, host.size()), 0);

  // The mapping's registration ends with the client, while the memory is still mapped.
  client.reset();
  EXPECT_EQ(mem.live(), 0);
  EXPECT_EQ(mem.unregistered_unmapped(), 0);
}

TEST_F(DeviceMemoryTest, SameHostPutsAreCopiedStraightIntoTheRegisteredSegment) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  auto client = cluster_.MakeClient(true);
  ASSERT_NE(client, nullptr);
  CopyEngineMemory mem(16 * MiB);
  std::vector<std::vector<ByteSpan>> parts;
  size_t offset = 0;
  for (int i = 0; i < 8; ++i) {
    keys_.push_back("devput/" + std::to_string(i));
    sizes_.push_back((i + 1) * 51 * KiB + i);
    const Bytes value = testdata::Pattern(keys_.back(), sizes_.back());
    std::memcpy(mem.shadow() + offset, value.data(), value.size());  // "on the GPU"
    parts.push_back({ByteSpan(mem.device() + offset, sizes_.back())});
    offset += sizes_.back();
    total_ += sizes_.back();
  }
  auto put = client->BatchPutFromDevice(keys_, parts, mem);
  for (size_t i = 0; i < keys_.size(); ++i) ASSERT_TRUE(put[i].ok()) << put[i].ToString();
  EXPECT_EQ(mem.copied_out_.load(), total_);
  EXPECT_EQ(mem.copied_into_registered_.load(), total_) << "a put bounced through host memory";
  EXPECT_EQ(client->Stats().shm_bytes_written_by_device, total_);
  // Stored exactly, with a checksum that holds: a plain host read verifies it.
  for (size_t i = 0; i < keys_.size(); ++i) {
    auto got = client->Get(keys_[i]);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, testdata::Pattern(keys_[i], sizes_[i]));
  }
  // A reader on "another host" (TCP) agrees, and a put over TCP bounces through host memory.
  auto remote = cluster_.MakeClient(false);
  ASSERT_NE(remote, nullptr);
  auto got = remote->Get(keys_[5]);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, testdata::Pattern(keys_[5], sizes_[5]));
  auto over_tcp = remote->BatchPutFromDevice({"devput/tcp"}, {parts[2]}, mem, {}, false);
  ASSERT_TRUE(over_tcp[0].ok()) << over_tcp[0].ToString();
  EXPECT_EQ(mem.copied_into_registered_.load(), total_);
  got = client->Get("devput/tcp");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, testdata::Pattern(keys_[2], sizes_[2]));
  // Device copies that keep failing fail the put (a failed write into a reservation is tried
  // once more the two-call way); the key stays absent.
  mem.FailCopies(1000);
  auto failed = client->BatchPutFromDevice({"devput/failed"}, {parts[0]}, mem);
  EXPECT_FALSE(failed[0].ok());
  mem.FailCopies(0);
  auto exists = client->Exist("devput/failed");
  ASSERT_TRUE(exists.ok());
  EXPECT_FALSE(*exists);
}

TEST_F(DeviceMemoryTest, AFailedDeviceCopyFailsItsKeyAlone) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB));
  auto client = cluster_.MakeClient(true);
  ASSERT_NE(client, nullptr);
  PutObjects(*client, 1, "devfail/");
  CopyEngineMemory mem(4 * MiB);
  // A batch's device copies share one wait, so a failed one is tried once more on its own: a
  // copy that fails twice is the key's answer.
  mem.FailCopies(2);
  auto got = client->BatchGetIntoDevice(
      keys_, {{MutableByteSpan(mem.device(), sizes_[0])}}, mem);
  ASSERT_FALSE(got[0].ok()) << "a get whose device copy failed was reported read";
  EXPECT_EQ(got[0].status().code(), ErrorCode::TRANSFER_FAIL);
  GetAllIntoDevice(*client, mem);  // and the next one works
  std::memset(mem.shadow(), 0, 4 * MiB);
  mem.FailCopies(1);  // as does one whose copy failed once
  GetAllIntoDevice(*client, mem);
}

// ReplicaIo::FinishDeviceRead's promise: a batch's device copies count as read only if their one
// wait ended within the read lease; here every wait outlasts it, so no key is reported read.
TEST_F(DeviceMemoryTest, ABatchWhoseDeviceWaitOutlastsTheReadLeaseIsNotReportedRead) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB, {{"--lease-ttl", "500ms"}}));
  auto client = cluster_.MakeClient(true);
  ASSERT_NE(client, nullptr);
  PutObjects(*client, 4, "devlate/");
  CopyEngineMemory mem(4 * MiB);
  mem.slow_wait_ms_ = 700;
  std::vector<std::vector<MutableByteSpan>> dst;
  size_t offset = 0;
  for (uint64_t n : sizes_) {
    dst.push_back({MutableByteSpan(mem.device() + offset, n)});
    offset += n;
  }
  auto got = client->BatchGetIntoDevice(keys_, dst, mem);
  for (size_t i = 0; i < keys_.size(); ++i) {
    ASSERT_FALSE(got[i].ok()) << keys_[i] << ": read though its copy ended after the lease";
    EXPECT_EQ(got[i].status().code(), ErrorCode::LEASE_EXPIRED) << got[i].status().ToString();
  }
  mem.slow_wait_ms_ = 0;
  GetAllIntoDevice(*client, mem);  // in time, the same batch is read
}

TEST_F(DeviceMemoryTest, OverTcpAndFromThreadsTheBytesComeThroughHostMemory) {
  ASSERT_TRUE(cluster_.Start(2, 32 * MiB));
  auto writer = cluster_.MakeClient(true);
  ASSERT_NE(writer, nullptr);
  PutObjects(*writer, 12, "devtcp/");
  auto remote = cluster_.MakeClient(false);  // as on another host
  ASSERT_NE(remote, nullptr);
  CopyEngineMemory mem(64 * MiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] { GetAllIntoDevice(*remote, mem, t * 16 * MiB); });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mem.copied_.load(), 3 * total_);
  EXPECT_EQ(mem.copied_from_registered_.load(), 0u);
  EXPECT_EQ(remote->Stats().shm_bytes_read_by_device, 0u);
  EXPECT_EQ(remote->Stats().tcp_bytes_read, 3 * total_);
}

TEST_F(DeviceMemoryTest, ObjectsOnlyOnDiskArriveToo) {
  TempDir disk("granary-devdisk-it");
  ASSERT_TRUE(cluster_.Start(0, 0, {{"--persistence", "eager"}, {"--promote-after", "0"}}));
  ASSERT_TRUE(cluster_.AddNode(32 * MiB, "", {"--disk-dir", disk.path(), "--disk-size", "128MiB",
                                              "--offload-interval", "100ms"}));
  auto client = cluster_.MakeClient(true);
  ASSERT_NE(client, nullptr);
  PutObjects(*client, 6, "devdisk/");
  auto on_disk_only = [&] {
    for (const auto& k : keys_) {
      auto st = client->Stat(k);
      if (!st.ok() || st->disk_replicas.empty()) return false;
    }
    return true;
  };
  ASSERT_TRUE(WaitUntil(on_disk_only, Millis(15'000), Millis(100)));
  ASSERT_TRUE(cluster_.RestartMaster());  // memory replicas forgotten, disk ones re-registered
  ASSERT_TRUE(WaitUntil(on_disk_only, Millis(15'000), Millis(100)));
  CopyEngineMemory mem(8 * MiB);
  GetAllIntoDevice(*client, mem);
  EXPECT_EQ(mem.copied_.load(), total_);
  EXPECT_EQ(client->Stats().shm_bytes_read_by_device, 0u);
  EXPECT_GE(client->Stats().disk_bytes_read, total_);
}

}  // namespace
}  // namespace granary::it
