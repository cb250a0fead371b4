// The disk tier's parameterized store tests (disk_store_test.cc, disk_store_eviction_test.cc):
// one fixture for every backend x I/O path (x O_DIRECT or not), instantiated once in
// disk_store_test.cc, and a gate that pins reads in flight.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/checksum.h"
#include "disk/disk_store.h"
#include "disk_test_util.h"

namespace granary::disk::store_test {

using testing::FindValue;
using testing::TempDir;
using testing::ValueFor;

// Reads pinned by the test hook: Remove and eviction must wait for them, and they must still get
// the right bytes (the file was theirs when they started).
class ReadGate {
 public:
  void Arrive() {
    std::unique_lock lock(mu_);
    arrived_ = true;
    cv_.notify_all();
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return released_; });
  }
  void WaitArrived() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return arrived_; });
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool arrived_ = false, released_ = false;
};

// One read, on its own thread, held at a test hook of the store (after its lookup or after its
// pin: install Hook() there) from Start() until Finish(). Declare the store before it, so that
// the store outlives the read.
struct HeldRead {
  explicit HeldRead(size_t size) : size(size), buffer(DiskStore::ReadBufferSize(size)) {}
  ~HeldRead() { Finish(); }
  std::function<void()> Hook() {
    return [this] {
      if (armed.exchange(false)) gate->Arrive();
    };
  }
  void Start(DiskStore& store, std::string key, uint64_t location) {
    armed = true;
    reader = std::thread([this, &store, key = std::move(key), location] {
      ReadRequest r{key, location, buffer.span()};
      result = store.Read(std::span(&r, 1))[0];
    });
    gate->WaitArrived();
  }
  void Finish() {
    gate->Release();
    if (reader.joinable()) reader.join();
  }
  // The read succeeded with ValueFor(key, gen, size)'s bytes.
  bool GotBytesOf(const std::string& key, uint64_t gen) const {
    auto want = ValueFor(key, gen, size);
    return result.status.ok() && std::memcmp(buffer.data(), want.data(), want.size()) == 0;
  }

  const size_t size;
  std::shared_ptr<ReadGate> gate = std::make_shared<ReadGate>();
  std::atomic<bool> armed{false};
  AlignedBuffer buffer;
  ReadResult result;
  std::thread reader;
};

struct StoreParam {
  DiskBackend backend;
  IoMode io;
  bool direct;
};

inline std::string ParamName(const ::testing::TestParamInfo<StoreParam>& info) {
  std::string name = std::string(BackendName(info.param.backend)) + "_" +
                     (info.param.io == IoMode::kUring ? "uring" : "posix");
  return info.param.direct ? name : name + "_buffered";
}

class DiskStoreTest : public ::testing::TestWithParam<StoreParam> {
 protected:
  DiskStoreOptions Options() const {
    DiskStoreOptions o;
    o.dir = dir_.path();
    o.backend = GetParam().backend;
    o.io = GetParam().io;
    o.direct_io = GetParam().direct;
    o.disk_size = 256ull << 20;
    o.bucket_max_keys = 8;
    return o;
  }
  std::unique_ptr<DiskStore> Open(DiskStoreOptions o) {
    auto store = DiskStore::Open(std::move(o));
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }
  std::unique_ptr<DiskStore> Open() { return Open(Options()); }
  // `o` opened with its reads stopping for `held` at `hook` (after the pin, or after the lookup).
  // The caller declares the store before `held`, so that it outlives the held read.
  std::unique_ptr<DiskStore> OpenHeld(
      DiskStoreOptions o, HeldRead& held,
      std::function<void()> DiskStoreOptions::*hook = &DiskStoreOptions::test_hook_after_pin) {
    o.*hook = held.Hook();
    return Open(std::move(o));
  }

  // Writes keys `prefix`0.. with the given sizes; expects every write to succeed.
  std::vector<StoredObject> WriteAll(DiskStore& store, const std::string& prefix,
                                     const std::vector<size_t>& sizes, uint64_t gen = 1) {
    std::vector<std::string> keys;
    std::vector<std::vector<std::byte>> values;
    std::vector<ObjectWrite> batch;
    for (size_t i = 0; i < sizes.size(); ++i) {
      keys.push_back(prefix + std::to_string(i));
      values.push_back(ValueFor(keys.back(), gen, sizes[i]));
    }
    for (size_t i = 0; i < sizes.size(); ++i) batch.push_back(ObjectWrite{keys[i], gen, values[i], {}});
    auto results = store.Write(batch);
    std::vector<StoredObject> out;
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_TRUE(results[i].ok()) << keys[i] << ": " << results[i].status().ToString();
      if (results[i].ok()) out.push_back(*results[i]);
    }
    return out;
  }

  // Reads every object in one batch and checks its bytes against ValueFor.
  void ExpectReadable(DiskStore& store, const std::vector<StoredObject>& objects) {
    std::vector<AlignedBuffer> buffers;
    std::vector<ReadRequest> requests;
    for (const auto& o : objects) buffers.emplace_back(std::max<uint64_t>(DiskStore::ReadBufferSize(o.size), 1));
    for (size_t i = 0; i < objects.size(); ++i) {
      requests.push_back(ReadRequest{objects[i].key, objects[i].location, buffers[i].span()});
    }
    auto results = store.Read(requests);
    ASSERT_EQ(results.size(), objects.size());
    for (size_t i = 0; i < objects.size(); ++i) {
      ASSERT_TRUE(results[i].status.ok()) << objects[i].key << ": " << results[i].status.ToString();
      ASSERT_EQ(results[i].size, objects[i].size);
      ASSERT_EQ(results[i].gen, objects[i].gen);
      auto want = ValueFor(objects[i].key, objects[i].gen, objects[i].size);
      ASSERT_EQ(results[i].checksum, objects[i].checksum) << objects[i].key;
      ASSERT_EQ(results[i].checksum, Checksum(want)) << objects[i].key;
      ASSERT_TRUE(want.empty() || std::memcmp(buffers[i].data(), want.data(), want.size()) == 0)
          << objects[i].key;
    }
  }

  ReadResult ReadOne(DiskStore& store, const std::string& key, uint64_t location = 0, size_t size = 1 << 20) {
    AlignedBuffer buffer(DiskStore::ReadBufferSize(size));
    ReadRequest r{key, location, buffer.span()};
    return store.Read(std::span(&r, 1))[0];
  }

  // Runs `body` on a store of this directory in a child process, which then dies without closing
  // the store (no destructor: nothing reclaimed, no offset shutdown index), as a crash right after
  // `body` returned. Returns "" or what went wrong in the child (a gtest failure there is not seen
  // by this process: `body` reports by its result).
  std::string InChildThenCrash(DiskStoreOptions o, const std::function<std::string(DiskStore&)>& body) {
    int fds[2];
    if (::pipe(fds) != 0) return "pipe";
    pid_t pid = ::fork();
    if (pid < 0) return "fork";
    if (pid == 0) {
      ::close(fds[0]);
      std::string outcome;
      std::thread worker([&] {  // a fresh thread: its own io_uring, not a copy of the parent's
        auto store = DiskStore::Open(std::move(o));
        if (!store.ok()) {
          outcome = "open: " + store.status().ToString();
          return;
        }
        outcome = body(**store);
        (void)store->release();  // never closed: the process dies with it open
      });
      worker.join();
      ssize_t ignored = ::write(fds[1], outcome.data(), outcome.size());
      (void)ignored;
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string outcome;
    char buf[512];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) outcome.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the child died: status " + std::to_string(status);
    return outcome;
  }

  // Keys listed by ListObjects, each with its copy; a key listed twice fails the test.
  std::map<std::string, StoredObject> Listed(DiskStore& store) {
    std::map<std::string, StoredObject> out;
    for (auto& o : store.ListObjects()) EXPECT_TRUE(out.emplace(o.key, o).second) << o.key << " listed twice";
    return out;
  }

  TempDir dir_;
};


}  // namespace granary::disk::store_test
