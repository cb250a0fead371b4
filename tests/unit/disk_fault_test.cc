// The disk tier against real faults on real files: a full filesystem mid-batch (a small tmpfs),
// torn writes left by a crash (partial buckets, .tmp files, truncated files, broken headers, a
// torn or damaged tombstone log), a writer process killed with -9 in the middle of its writes or
// removes, and open-time errors (missing or read-only directory, no O_DIRECT, another backend's
// directory, bad options).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/checksum.h"
#include "disk/disk_store.h"
#include "disk_test_util.h"

namespace granary::disk {
namespace {

using testing::FindValue;
using testing::TempDir;
using testing::ValueFor;

namespace fs = std::filesystem;

// Reads `objects` back and returns "" when every one is byte-exact, else what went wrong.
std::string CheckReadable(DiskStore& store, const std::vector<StoredObject>& objects) {
  for (const auto& o : objects) {
    AlignedBuffer buffer(std::max<uint64_t>(DiskStore::ReadBufferSize(o.size), 1));
    ReadRequest r{o.key, o.location, buffer.span()};
    auto result = store.Read(std::span(&r, 1))[0];
    if (!result.status.ok()) return o.key + ": " + result.status.ToString();
    auto want = ValueFor(o.key, o.gen, o.size);
    if (result.size != o.size || (!want.empty() && std::memcmp(buffer.data(), want.data(), want.size()) != 0)) {
      return o.key + ": wrong bytes";
    }
  }
  return "";
}

size_t CountFiles(const std::string& dir, const std::string& suffix) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) ++n;
  }
  return n;
}

// --- disk full ---------------------------------------------------------------------------------

// Runs on an 8 MiB filesystem; "" when the store behaved. No gtest macros: it may run in a child.
std::string DiskFullScenario(const std::string& dir, DiskBackend backend, IoMode io) {
  DiskStoreOptions o;
  o.dir = dir;
  o.backend = backend;
  o.io = io;
  o.bucket_max_keys = 2;
  if (backend == DiskBackend::kOffset) {
    // Preallocation moves a full disk to open time: a file larger than the filesystem is refused.
    o.disk_size = 64ull << 20;
    auto refused = DiskStore::Open(o);
    if (refused.ok() || refused.code() != ErrorCode::NO_AVAILABLE_HANDLE) {
      return "offset open past the filesystem: " + (refused.ok() ? std::string("OK") : refused.status().ToString());
    }
    if (fs::exists(dir + "/offset.data")) return "a refused offset file was left behind";
    o.disk_size = 4ull << 20;
  } else {
    o.disk_size = 1ull << 30;  // the budget is not what stops it: the filesystem is
  }
  auto opened = DiskStore::Open(o);
  if (!opened.ok()) return "open: " + opened.status().ToString();
  auto& store = **opened;
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < 16; ++i) {
    keys.push_back("full" + std::to_string(i));
    values.push_back(ValueFor(keys.back(), 1, 1 << 20));
  }
  std::vector<ObjectWrite> batch;
  for (int i = 0; i < 16; ++i) batch.push_back(ObjectWrite{keys[i], 1, values[i], {}});
  auto results = store.Write(batch);
  std::vector<StoredObject> stored;
  for (auto& r : results) {
    if (r.ok()) {
      stored.push_back(*r);
    } else if (r.code() != ErrorCode::NO_AVAILABLE_HANDLE) {
      return "a failed write is not NO_AVAILABLE_HANDLE: " + r.status().ToString();
    }
  }
  if (stored.empty() || stored.size() == 16) {
    return "expected some of 16 x 1 MiB to fit 8 MiB, got " + std::to_string(stored.size());
  }
  if (std::string bad = CheckReadable(store, stored); !bad.empty()) return "after ENOSPC: " + bad;
  if (CountFiles(dir, ".tmp") != 0) return "a failed write left a .tmp file";
  if (store.Usage().objects != stored.size()) return "the index holds objects that failed";
  // Space comes back: remove what was written, and a write succeeds again.
  for (auto& s : stored) {
    if (!store.Remove(s.key).ok()) return "remove " + s.key;
  }
  auto again = store.Write(std::span(&batch[0], 1));
  if (!again[0].ok()) return "write after freeing space: " + again[0].status().ToString();
  opened->reset();
  auto reopened = DiskStore::Open(o);
  if (!reopened.ok()) return "reopen: " + reopened.status().ToString();
  if ((*reopened)->ListObjects().size() != 1) {
    return "reopen found " + std::to_string((*reopened)->ListObjects().size()) + " objects, expected 1";
  }
  return CheckReadable(**reopened, {*again[0]});
}

// In a child process with its own user and mount namespaces (no privilege needed where user
// namespaces are allowed): mounts a tmpfs on `dir` and runs the scenario. Returns nullopt when the
// child could not mount either.
std::optional<std::string> RunDiskFullInNamespace(const std::string& dir, DiskBackend backend, IoMode io) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return std::nullopt;
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    auto write_file = [](const char* path, const std::string& text) {
      int fd = ::open(path, O_WRONLY);
      bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      if (fd >= 0) ::close(fd);
      return ok;
    };
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) ::_exit(77);
    write_file("/proc/self/setgroups", "deny");
    if (!write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
        !write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1") ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=8m") != 0) {
      ::_exit(77);
    }
    std::string outcome;
    std::thread worker([&] { outcome = DiskFullScenario(dir, backend, io); });  // a fresh ring
    worker.join();
    ::umount2(dir.c_str(), MNT_DETACH);
    ssize_t ignored = ::write(pipe_fds[1], outcome.data(), outcome.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string outcome;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) outcome.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) == 77) return std::nullopt;
  return outcome;
}

struct FaultParam {
  DiskBackend backend;
  IoMode io;
};

std::string FaultName(const ::testing::TestParamInfo<FaultParam>& info) {
  return std::string(BackendName(info.param.backend)) + (info.param.io == IoMode::kUring ? "_uring" : "_posix");
}

class DiskFaultTest : public ::testing::TestWithParam<FaultParam> {};

TEST_P(DiskFaultTest, DiskFullMidBatchFailsOnlyWhatDidNotFit) {
  TempDir dir;
  const bool force_namespace = std::getenv("GRANARY_TEST_FORCE_USERNS") != nullptr;
  if (!force_namespace && dir.Mount("tmpfs", "size=8m")) {
    EXPECT_EQ(DiskFullScenario(dir.path(), GetParam().backend, GetParam().io), "");
    return;
  }
  auto outcome = RunDiskFullInNamespace(dir.path(), GetParam().backend, GetParam().io);
  if (!outcome) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (no mount rights, no user namespaces): the "
                    "byte budget test (ByteBudgetRefusesWhatDoesNotFit...) still covers a full store";
  }
  EXPECT_EQ(*outcome, "");
}

// --- a writer killed with -9 -------------------------------------------------------------------

uint64_t SizeFor(const std::string& key, uint64_t gen) {
  return 4096 + (std::hash<std::string>{}(key) ^ (gen * 7919)) % (300 << 10);
}

// The child: writes batches of 8 objects forever (keys cycle, generations grow from
// first_batch), telling the parent after each fully acknowledged batch. It is killed.
[[noreturn]] void WriterChild(const std::string& dir, DiskBackend backend, IoMode io, int ack_fd,
                              uint32_t first_batch) {
  DiskStoreOptions o;
  o.dir = dir;
  o.backend = backend;
  o.io = io;
  o.disk_size = 128ull << 20;
  o.bucket_max_keys = 4;
  auto store = DiskStore::Open(o);
  if (!store.ok()) ::_exit(3);
  for (uint32_t batch = first_batch; batch < first_batch + 100000; ++batch) {
    std::vector<std::string> keys;
    std::vector<std::vector<std::byte>> values;
    for (uint32_t j = 0; j < 8; ++j) {
      keys.push_back("key" + std::to_string((batch * 8 + j) % 40));
      values.push_back(ValueFor(keys.back(), batch, SizeFor(keys.back(), batch)));
    }
    std::vector<ObjectWrite> writes;
    for (uint32_t j = 0; j < 8; ++j) writes.push_back(ObjectWrite{keys[j], batch, values[j], {}});
    for (auto& r : (*store)->Write(writes)) {
      if (!r.ok()) ::_exit(4);
    }
    if (::write(ack_fd, &batch, sizeof(batch)) != sizeof(batch)) ::_exit(5);
  }
  ::_exit(6);
}

class DiskKillTest : public ::testing::TestWithParam<FaultParam> {};

TEST_P(DiskKillTest, WriterKilledMidWriteLeavesOnlyByteExactObjects) {
  TempDir dir;
  std::mt19937 rng(std::random_device{}());
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      // A fresh thread: its own io_uring, not a copy of the parent thread's.
      std::thread worker([&] {
        WriterChild(dir.path(), GetParam().backend, GetParam().io, fds[1], 1 + attempt * 1000000);
      });
      worker.join();
      ::_exit(7);
    }
    ::close(fds[1]);
    // Let it acknowledge a few batches, then kill it at a random moment of the next ones.
    uint32_t last_acked = 0, acks = 0;  // generations only grow, across attempts too
    const int want_acks = 2 + attempt * 3;
    while (acks < static_cast<uint32_t>(want_acks)) {
      pollfd p{fds[0], POLLIN, 0};
      ASSERT_EQ(::poll(&p, 1, 20000), 1) << "the writer stopped acknowledging";
      ASSERT_EQ(::read(fds[0], &last_acked, sizeof(last_acked)), static_cast<ssize_t>(sizeof(last_acked)))
          << "the writer died on its own";
      ++acks;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited with " << WEXITSTATUS(status);
    uint32_t ack;
    while (::read(fds[0], &ack, sizeof(ack)) == static_cast<ssize_t>(sizeof(ack))) last_acked = ack;
    ::close(fds[0]);

    DiskStoreOptions o;
    o.dir = dir.path();
    o.backend = GetParam().backend;
    o.io = GetParam().io;
    o.disk_size = 128ull << 20;
    o.bucket_max_keys = 4;
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto recovered = (*store)->ListObjects();
    ASSERT_FALSE(recovered.empty());
    std::cout << "kill -9 after batch " << last_acked << ": " << recovered.size() << " objects recovered, "
              << (*store)->recovery().units_discarded << " torn file(s) discarded\n";
    std::map<std::string, uint64_t> gen_of;
    for (const auto& obj : recovered) {
      EXPECT_EQ(obj.size, SizeFor(obj.key, obj.gen)) << obj.key;
      EXPECT_EQ(obj.checksum, Checksum(ValueFor(obj.key, obj.gen, obj.size))) << obj.key;
      gen_of[obj.key] = obj.gen;
    }
    EXPECT_EQ(CheckReadable(**store, recovered), "") << "every recovered object reads byte-exact";
    // Everything the writer had acknowledged survived (a process crash loses no completed write).
    for (uint32_t j = 0; j < 8; ++j) {
      std::string key = "key" + std::to_string((last_acked * 8 + j) % 40);
      ASSERT_TRUE(gen_of.count(key)) << key << " of acknowledged batch " << last_acked << " is gone";
      EXPECT_GE(gen_of[key], last_acked) << key;
    }
    EXPECT_EQ(CountFiles(dir.path(), ".tmp"), 0u) << "recovery deletes what a crash left half-done";
    EXPECT_FALSE((*store)->recovery().used_shutdown_index) << "a killed writer leaves no index to trust";
    // The next writer continues on this directory (the next attempt starts from it).
  }
}

// The child: writes batches of 8 new keys (two buckets of 4), then removes six of them - the
// whole second bucket and two copies of the first - and tells the parent after each batch whose
// removes all returned. It is killed.
[[noreturn]] void RemoverChild(const std::string& dir, DiskBackend backend, IoMode io, int ack_fd,
                               uint32_t first_batch) {
  DiskStoreOptions o;
  o.dir = dir;
  o.backend = backend;
  o.io = io;
  o.disk_size = 128ull << 20;
  o.bucket_max_keys = 4;
  auto store = DiskStore::Open(o);
  if (!store.ok()) ::_exit(3);
  for (uint32_t batch = first_batch; batch < first_batch + 100000; ++batch) {
    std::vector<std::string> keys;
    std::vector<std::vector<std::byte>> values;
    for (uint32_t j = 0; j < 8; ++j) {
      keys.push_back("b" + std::to_string(batch) + "_" + std::to_string(j));
      values.push_back(ValueFor(keys.back(), 1, 4096 + SizeFor(keys.back(), 1) % 9000));
    }
    std::vector<ObjectWrite> writes;
    for (uint32_t j = 0; j < 8; ++j) writes.push_back(ObjectWrite{keys[j], 1, values[j], {}});
    auto written = (*store)->Write(writes);
    for (auto& r : written) {
      if (!r.ok()) ::_exit(4);
    }
    for (uint32_t j : {1u, 3u, 4u, 5u, 6u, 7u}) {
      if (!(*store)->Remove(keys[j], written[j]->location).ok()) ::_exit(5);
    }
    if (::write(ack_fd, &batch, sizeof(batch)) != sizeof(batch)) ::_exit(6);
  }
  ::_exit(7);
}

TEST_P(DiskKillTest, RemoverKilledMidRemoveNeverBringsARemovedCopyBack) {
  TempDir dir;
  std::mt19937 rng(std::random_device{}());
  std::vector<std::pair<uint32_t, uint32_t>> acked;  // per attempt: first batch, last acknowledged
  for (int attempt = 0; attempt < 3; ++attempt) {
    const uint32_t first = 1 + attempt * 1000000;
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      std::thread worker([&] { RemoverChild(dir.path(), GetParam().backend, GetParam().io, fds[1], first); });
      worker.join();
      ::_exit(8);
    }
    ::close(fds[1]);
    uint32_t last_acked = 0, acks = 0;
    const int want_acks = 2 + attempt * 3;
    while (acks < static_cast<uint32_t>(want_acks)) {
      pollfd p{fds[0], POLLIN, 0};
      ASSERT_EQ(::poll(&p, 1, 20000), 1) << "the remover stopped acknowledging";
      ASSERT_EQ(::read(fds[0], &last_acked, sizeof(last_acked)), static_cast<ssize_t>(sizeof(last_acked)))
          << "the remover died on its own";
      ++acks;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the remover exited with " << WEXITSTATUS(status);
    uint32_t ack;
    while (::read(fds[0], &ack, sizeof(ack)) == static_cast<ssize_t>(sizeof(ack))) last_acked = ack;
    ::close(fds[0]);
    acked.emplace_back(first, last_acked);

    DiskStoreOptions o;
    o.dir = dir.path();
    o.backend = GetParam().backend;
    o.io = GetParam().io;
    o.disk_size = 128ull << 20;
    o.bucket_max_keys = 4;
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto recovered = (*store)->ListObjects();
    std::set<std::string> keys;
    for (const auto& obj : recovered) keys.insert(obj.key);
    EXPECT_EQ(CheckReadable(**store, recovered), "") << "every recovered object reads byte-exact";
    size_t batches = 0;
    for (const auto& [from, to] : acked) {  // this attempt's and every earlier one's
      for (uint32_t batch = from; batch <= to; ++batch, ++batches) {
        const std::string prefix = "b" + std::to_string(batch) + "_";
        for (uint32_t j = 0; j < 8; ++j) {
          const bool removed = j != 0 && j != 2;
          EXPECT_EQ(keys.count(prefix + std::to_string(j)), removed ? 0u : 1u)
              << prefix << j << (removed ? " was removed, yet came back" : " was acknowledged, yet is gone");
        }
      }
    }
    std::cout << "kill -9 after batch " << last_acked << ": " << recovered.size() << " objects recovered, "
              << batches << " acknowledged batches checked\n";
  }
}

const auto kFaultParams = ::testing::Values(FaultParam{DiskBackend::kBucket, IoMode::kUring},
                                            FaultParam{DiskBackend::kBucket, IoMode::kPosix},
                                            FaultParam{DiskBackend::kFilePerKey, IoMode::kUring},
                                            FaultParam{DiskBackend::kFilePerKey, IoMode::kPosix},
                                            FaultParam{DiskBackend::kOffset, IoMode::kUring},
                                            FaultParam{DiskBackend::kOffset, IoMode::kPosix});
INSTANTIATE_TEST_SUITE_P(Disk, DiskFaultTest, kFaultParams, FaultName);
INSTANTIATE_TEST_SUITE_P(Disk, DiskKillTest, kFaultParams, FaultName);

// --- torn writes left by a crash, made by hand ---------------------------------------------------

DiskStoreOptions TornOptions(const std::string& dir, DiskBackend backend) {
  DiskStoreOptions o;
  o.dir = dir;
  o.backend = backend;
  o.disk_size = 64ull << 20;
  o.bucket_max_keys = 2;
  return o;
}

std::vector<StoredObject> WriteKeys(DiskStore& store, const std::vector<std::string>& keys, size_t size) {
  std::vector<std::vector<std::byte>> values;
  for (const auto& k : keys) values.push_back(ValueFor(k, 1, size));
  std::vector<ObjectWrite> batch;
  for (size_t i = 0; i < keys.size(); ++i) batch.push_back(ObjectWrite{keys[i], 1, values[i], {}});
  std::vector<StoredObject> out;
  for (auto& r : store.Write(batch)) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) out.push_back(*r);
  }
  return out;
}

std::string Bucket(const std::string& dir, uint64_t id, const std::string& ext) {
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(id));
  return dir + "/buckets/" + name + ext;
}

TEST(DiskTornWriteTest, BucketRecoveryDiscardsEveryTornBucket) {
  TempDir dir;
  std::vector<StoredObject> objects;
  {
    auto store = DiskStore::Open(TornOptions(dir.path(), DiskBackend::kBucket));
    ASSERT_TRUE(store.ok());
    objects = WriteKeys(**store, {"a", "b", "c", "d", "e", "f"}, 70000);  // buckets 1, 2, 3
  }
  // Bucket 1: its metadata torn (a byte of it changed).
  testing::FlipByte({Bucket(dir.path(), 1, ".meta"), 0}, 70);
  // Bucket 3: its data file cut short.
  fs::resize_file(Bucket(dir.path(), 3, ".data"), 8192);
  // Bucket 9: data written, crash before the metadata. Bucket 10: crash before the rename.
  fs::copy_file(Bucket(dir.path(), 2, ".data"), Bucket(dir.path(), 9, ".data"));
  fs::copy_file(Bucket(dir.path(), 2, ".data"), Bucket(dir.path(), 10, ".data"));
  fs::copy_file(Bucket(dir.path(), 2, ".meta"), Bucket(dir.path(), 10, ".meta.tmp"));
  // A bucket whose data file was deleted.
  fs::copy_file(Bucket(dir.path(), 2, ".meta"), Bucket(dir.path(), 11, ".meta"));

  auto store = DiskStore::Open(TornOptions(dir.path(), DiskBackend::kBucket));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const RecoveryReport& rec = (*store)->recovery();
  EXPECT_EQ(rec.units_discarded, 6u) << "1, 3, 9, 10 (data and .tmp), 11";
  EXPECT_FALSE(rec.problems.empty());
  auto listed = (*store)->ListObjects();
  std::set<std::string> keys;
  for (auto& o : listed) keys.insert(o.key);
  EXPECT_EQ(keys, (std::set<std::string>{"c", "d"})) << "only bucket 2 was intact";
  EXPECT_EQ(CheckReadable(**store, listed), "");
  // What was discarded is gone from the directory; new buckets never reuse a seen id.
  EXPECT_EQ(CountFiles(dir.path() + "/buckets", ".data"), 1u);
  EXPECT_EQ(CountFiles(dir.path() + "/buckets", ".meta"), 1u);
  auto fresh = WriteKeys(**store, {"g"}, 5000);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_TRUE(fs::exists(Bucket(dir.path(), 12, ".data")));
  EXPECT_EQ(CheckReadable(**store, fresh), "");
}

TEST(DiskTornWriteTest, FileRecoveryDiscardsTornFiles) {
  TempDir dir;
  std::vector<StoredObject> objects;
  {
    auto store = DiskStore::Open(TornOptions(dir.path(), DiskBackend::kFilePerKey));
    ASSERT_TRUE(store.ok());
    objects = WriteKeys(**store, {"intact", "cut", "broken", "copied"}, 70000);
  }
  auto cut = FindValue(dir.path(), ValueFor("cut", 1, 70000));
  auto broken = FindValue(dir.path(), ValueFor("broken", 1, 70000));
  auto copied = FindValue(dir.path(), ValueFor("copied", 1, 70000));
  ASSERT_TRUE(cut && broken && copied);
  fs::resize_file(cut->path, 4096 + 8192);            // truncated value
  testing::FlipByte({broken->path, 0}, 20);            // header (its generation) changed
  fs::rename(copied->path, copied->path + ".tmp");     // never renamed into place
  auto store = DiskStore::Open(TornOptions(dir.path(), DiskBackend::kFilePerKey));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->recovery().units_discarded, 3u);
  auto listed = (*store)->ListObjects();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].key, "intact");
  EXPECT_EQ(CheckReadable(**store, listed), "");
  EXPECT_EQ(CountFiles(dir.path(), ".obj"), 1u);
  EXPECT_EQ(CountFiles(dir.path(), ".tmp"), 0u);
}

TEST(DiskTornWriteTest, OffsetRecoveryDropsRecordsWithoutAValidHeader) {
  TempDir dir;
  {
    auto store = DiskStore::Open(TornOptions(dir.path(), DiskBackend::kOffset));
    ASSERT_TRUE(store.ok());
    WriteKeys(**store, {"first", "middle", "last"}, 70000);
  }
  // A crash leaves no shutdown index (the clean close above wrote one).
  ASSERT_TRUE(fs::remove(dir.path() + "/offset.index"));
  // "middle": its header block as a crash between value and header leaves it (never written),
  // "last": a header byte changed.
  auto middle = FindValue(dir.path(), ValueFor("middle", 1, 70000));
  auto last = FindValue(dir.path(), ValueFor("last", 1, 70000));
  ASSERT_TRUE(middle && last);
  {
    std::fstream f(middle->path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(middle->offset - 4096));
    std::vector<char> zeros(4096, 0);
    f.write(zeros.data(), zeros.size());
  }
  testing::FlipByte({last->path, last->offset - 4096}, 30);
  auto store = DiskStore::Open(TornOptions(dir.path(), DiskBackend::kOffset));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto listed = (*store)->ListObjects();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].key, "first");
  EXPECT_EQ(CheckReadable(**store, listed), "");
  // The dropped records' space is free again: the file fills up to its size.
  const uint64_t free_bytes = (*store)->Usage().capacity - (*store)->Usage().used;
  EXPECT_EQ((*store)->Usage().used, 4096u + 73728u);
  auto more = WriteKeys(**store, {"x", "y"}, 70000);
  EXPECT_EQ(more.size(), 2u);
  EXPECT_EQ(CheckReadable(**store, more), "");
  EXPECT_LT((*store)->Usage().capacity - (*store)->Usage().used, free_bytes);
}

std::string TombstoneLog(const std::string& dir) { return dir + "/buckets/tombstones"; }

TEST(DiskTornWriteTest, TornTombstoneAtTheLogsEndIsIgnored) {
  TempDir dir;
  DiskStoreOptions o = TornOptions(dir.path(), DiskBackend::kBucket);
  o.bucket_max_keys = 8;
  std::vector<StoredObject> objects;
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    objects = WriteKeys(**store, {"a", "b", "c", "d", "e", "f"}, 20000);  // one bucket
    for (const char* key : {"a", "b", "c"}) ASSERT_TRUE((*store)->Remove(key).ok()) << key;
  }
  ASSERT_EQ(fs::file_size(TombstoneLog(dir.path())), 3u * 48);
  // c's record cut short, as by a crash mid-append (before Remove("c") could return).
  fs::resize_file(TombstoneLog(dir.path()), 3 * 48 - 20);
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->recovery().units_discarded, 0u);
  bool reported = false;
  for (const auto& p : (*store)->recovery().problems) reported |= p.find("torn") != std::string::npos;
  EXPECT_TRUE(reported) << "the torn record is reported";
  auto listed = (*store)->ListObjects();
  std::set<std::string> keys;
  for (auto& l : listed) keys.insert(l.key);
  EXPECT_EQ(keys, (std::set<std::string>{"c", "d", "e", "f"})) << "a and b stay removed; c's tombstone never was";
  EXPECT_EQ(CheckReadable(**store, listed), "");
  EXPECT_EQ(fs::file_size(TombstoneLog(dir.path())), 2u * 48) << "rewritten without the torn bytes";
  // Appends go on after the last whole record.
  ASSERT_TRUE((*store)->Remove("d").ok());
  EXPECT_EQ(fs::file_size(TombstoneLog(dir.path())), 3u * 48);
  store->reset();
  auto reopened = DiskStore::Open(o);
  ASSERT_TRUE(reopened.ok());
  keys.clear();
  for (auto& l : (*reopened)->ListObjects()) keys.insert(l.key);
  EXPECT_EQ(keys, (std::set<std::string>{"c", "e", "f"}));
}

TEST(DiskTornWriteTest, DamagedTombstoneIsIgnoredNeverMisapplied) {
  TempDir dir;
  DiskStoreOptions o = TornOptions(dir.path(), DiskBackend::kBucket);
  o.bucket_max_keys = 8;
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    WriteKeys(**store, {"a", "b", "c"}, 20000);
    ASSERT_TRUE((*store)->Remove("a").ok());
    ASSERT_TRUE((*store)->Remove("b").ok());
  }
  testing::FlipByte({TombstoneLog(dir.path()), 0}, 20);  // a's record: its bucket id
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::set<std::string> keys;
  auto listed = (*store)->ListObjects();
  for (auto& l : listed) keys.insert(l.key);
  EXPECT_EQ(keys, (std::set<std::string>{"a", "c"})) << "a damaged tombstone removes nothing";
  EXPECT_EQ(CheckReadable(**store, listed), "");
  EXPECT_EQ(fs::file_size(TombstoneLog(dir.path())), 48u);
}

// A tombstone names its copy by key and generation too: one left over from another bucket of the
// same id (here: another store's log, same salt) removes nothing else.
TEST(DiskTornWriteTest, ATombstoneOnlyRemovesTheCopyItNames) {
  TempDir first, second;
  DiskStoreOptions o = TornOptions(first.path(), DiskBackend::kBucket);
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    WriteKeys(**store, {"a", "b"}, 5000);  // bucket 1
    ASSERT_TRUE((*store)->Remove("a").ok());  // bucket 1, slot 0
  }
  fs::copy_file(first.path() + "/FORMAT", second.path() + "/FORMAT");
  o.dir = second.path();
  std::vector<StoredObject> objects;
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    objects = WriteKeys(**store, {"x", "y"}, 5000);  // bucket 1 again
  }
  fs::copy_file(TombstoneLog(first.path()), TombstoneLog(second.path()), fs::copy_options::overwrite_existing);
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->ListObjects().size(), 2u) << "x sits in bucket 1, slot 0, but is not a";
  EXPECT_EQ(CheckReadable(**store, objects), "");
  EXPECT_EQ(fs::file_size(TombstoneLog(second.path())), 0u) << "a tombstone that names nothing is dropped";
}

// A crash between a write and the tombstone of the copy it replaced leaves both copies; recovery
// keeps the newer and retires the older, so that removing the newer later cannot revive it.
TEST(DiskTornWriteTest, SupersededCopyLeftByACrashIsRetiredAtRecovery) {
  TempDir dir;
  const DiskStoreOptions o = TornOptions(dir.path(), DiskBackend::kBucket);
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    WriteKeys(**store, {"k", "other"}, 5000);  // one bucket
    const auto value = ValueFor("k", 2, 7000);
    ObjectWrite newer{"k", 2, value, {}};
    ASSERT_TRUE((*store)->Write(std::span(&newer, 1))[0].ok());
  }
  ASSERT_EQ(fs::file_size(TombstoneLog(dir.path())), 48u) << "the gen 1 copy's tombstone";
  fs::resize_file(TombstoneLog(dir.path()), 0);  // the crash came before it
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto k = (*store)->Lookup("k");
    ASSERT_TRUE(k);
    EXPECT_EQ(k->gen, 2u) << "the higher generation wins";
    EXPECT_EQ((*store)->ListObjects().size(), 2u);
    EXPECT_EQ(fs::file_size(TombstoneLog(dir.path())), 48u) << "recovery retired the gen 1 copy";
    ASSERT_TRUE((*store)->Remove("k").ok());
  }
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok());
  auto listed = (*store)->ListObjects();
  ASSERT_EQ(listed.size(), 1u) << "gen 1 did not step in for the removed gen 2";
  EXPECT_EQ(listed[0].key, "other");
}

// When the durable step of a remove fails, the copy still leaves the index and the caller hears.
TEST(DiskRemoveFaultTest, AFailedDurableStepIsReportedAndTheKeyIsStillDropped) {
  for (DiskBackend backend : {DiskBackend::kBucket, DiskBackend::kOffset}) {
    SCOPED_TRACE(std::string(BackendName(backend)));
    TempDir dir;
    DiskStoreOptions o = TornOptions(dir.path(), backend);
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    auto objects = WriteKeys(**store, {"a", "b"}, 20000);  // one bucket, or two records
    ASSERT_EQ(objects.size(), 2u);
    Status st;
    {
      // What the remove must write to: the tombstone log, or the offset file (a's header).
      testing::ReadOnlyFds fail(backend == DiskBackend::kBucket ? TombstoneLog(dir.path())
                                                                : dir.path() + "/offset.data");
      ASSERT_GE(fail.count(), 1u);
      st = (*store)->Remove("a", objects[0].location);
      EXPECT_FALSE((*store)->Lookup("a")) << "out of the index all the same";
      EXPECT_EQ(CheckReadable(**store, {objects[1]}), "") << "reads still work";
    }
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("may come back"), std::string::npos) << st.ToString();
    AlignedBuffer buffer(DiskStore::ReadBufferSize(20000));
    ReadRequest r{"a", 0, buffer.span()};
    EXPECT_EQ((*store)->Read(std::span(&r, 1))[0].status.code(), ErrorCode::OBJECT_NOT_FOUND);
    EXPECT_EQ((*store)->Remove("a").code(), ErrorCode::OBJECT_NOT_FOUND);
    ASSERT_TRUE((*store)->Remove("b").ok()) << "the next remove works again";
  }
}

TEST(DiskBucketTest, TombstoneLogStaysSmall) {
  TempDir dir;
  DiskStoreOptions o = TornOptions(dir.path(), DiskBackend::kBucket);
  o.bucket_max_keys = 2;
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok());
  // Each round: a bucket of two, one removed (a tombstone), then the other (the bucket goes).
  uint64_t largest = 0;
  for (int i = 0; i < 1500; ++i) {
    const std::string a = "t" + std::to_string(i) + "a", b = "t" + std::to_string(i) + "b";
    ASSERT_EQ(WriteKeys(**store, {a, b}, 100).size(), 2u);
    ASSERT_TRUE((*store)->Remove(a).ok());
    ASSERT_TRUE((*store)->Remove(b).ok());
    largest = std::max<uint64_t>(largest, fs::file_size(TombstoneLog(dir.path())));
  }
  EXPECT_LT(largest, 1500u * 48) << "tombstones of deleted buckets are dropped as the store runs";
  EXPECT_EQ(CountFiles(dir.path() + "/buckets", ".data"), 0u);
  auto kept = WriteKeys(**store, {"x", "y"}, 100);
  ASSERT_TRUE((*store)->Remove("x").ok());
  store->reset();
  auto reopened = DiskStore::Open(o);
  ASSERT_TRUE(reopened.ok());
  auto listed = (*reopened)->ListObjects();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].key, "y");
  EXPECT_EQ(fs::file_size(TombstoneLog(dir.path())), 48u) << "only x's tombstone still applies";
}

TEST(DiskOffsetIndexTest, CleanCloseReopensFromTheIndexWithoutAScan) {
  TempDir dir;
  const DiskStoreOptions o = TornOptions(dir.path(), DiskBackend::kOffset);
  std::vector<StoredObject> kept;
  uint64_t used = 0;
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    EXPECT_FALSE((*store)->recovery().used_shutdown_index) << "a new file has none";
    auto objects = WriteKeys(**store, {"keep", "removed", "evicted", "keep2"}, 70000);
    ASSERT_EQ(objects.size(), 4u);
    ASSERT_TRUE((*store)->Remove("removed").ok());
    ASSERT_EQ((*store)->SelectVictims(1).size(), 1u);  // fifo: "keep" is the oldest
    kept = {objects[2], objects[3]};
    // Phase two never ran: closing deletes what it would have.
  }
  ASSERT_TRUE(fs::exists(dir.path() + "/offset.index"));
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    EXPECT_TRUE((*store)->recovery().used_shutdown_index);
    EXPECT_FALSE(fs::exists(dir.path() + "/offset.index")) << "trusted once, then gone before any write";
    auto listed = (*store)->ListObjects();
    std::set<std::string> keys;
    for (auto& l : listed) keys.insert(l.key);
    EXPECT_EQ(keys, (std::set<std::string>{"evicted", "keep2"}));
    EXPECT_EQ(CheckReadable(**store, kept), "");
    used = (*store)->Usage().used;
    EXPECT_EQ(used, 2 * (4096u + AlignUp(70000))) << "removed and evicted records' space is free";
    auto more = WriteKeys(**store, {"after"}, 5000);
    kept.insert(kept.end(), more.begin(), more.end());
  }
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE((*store)->recovery().used_shutdown_index);
  EXPECT_EQ((*store)->ListObjects().size(), 3u);
  EXPECT_EQ(CheckReadable(**store, kept), "");
}

TEST(DiskOffsetIndexTest, DamagedIndexFallsBackToScanningTheFile) {
  TempDir dir;
  const DiskStoreOptions o = TornOptions(dir.path(), DiskBackend::kOffset);
  std::vector<StoredObject> objects;
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    objects = WriteKeys(**store, {"a", "b", "c"}, 20000);
  }
  testing::FlipByte({dir.path() + "/offset.index", 0}, 70);
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_FALSE((*store)->recovery().used_shutdown_index);
  ASSERT_FALSE((*store)->recovery().problems.empty());
  EXPECT_NE((*store)->recovery().problems.back().find("shutdown index"), std::string::npos);
  EXPECT_EQ((*store)->ListObjects().size(), 3u) << "the scan finds every record";
  EXPECT_EQ(CheckReadable(**store, objects), "");
  EXPECT_FALSE(fs::exists(dir.path() + "/offset.index"));
}

// --- open-time errors ----------------------------------------------------------------------------

TEST(DiskOpenTest, MissingFileOrForeignDirectoryIsAClearError) {
  TempDir dir;
  DiskStoreOptions o;
  o.dir = dir.path() + "/does-not-exist";
  auto missing = DiskStore::Open(o);
  EXPECT_EQ(missing.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(missing.status().message().find("does not exist"), std::string::npos);
  std::ofstream(dir.path() + "/plain") << "x";
  o.dir = dir.path() + "/plain";
  EXPECT_EQ(DiskStore::Open(o).code(), ErrorCode::INVALID_PARAMS);
  o.dir = "";
  EXPECT_EQ(DiskStore::Open(o).code(), ErrorCode::INVALID_PARAMS);

  o.dir = dir.path();
  o.disk_size = 8 << 20;
  ASSERT_TRUE(DiskStore::Open(o).ok());
  o.backend = DiskBackend::kOffset;
  auto foreign = DiskStore::Open(o);
  EXPECT_EQ(foreign.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(foreign.status().message().find("holds a 'bucket' store"), std::string::npos);
}

TEST(DiskOpenTest, OneStorePerDirectory) {
  TempDir dir;
  DiskStoreOptions o;
  o.dir = dir.path();
  o.disk_size = 8 << 20;
  auto first = DiskStore::Open(o);
  ASSERT_TRUE(first.ok());
  auto second = DiskStore::Open(o);
  EXPECT_EQ(second.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status().ToString();
  first->reset();
  EXPECT_TRUE(DiskStore::Open(o).ok()) << "the lock goes with the store";
}

TEST(DiskOpenTest, BadOptionsAreRefused) {
  TempDir dir;
  auto with = [&](auto change) {
    DiskStoreOptions o;
    o.dir = dir.path();
    o.disk_size = 8 << 20;
    change(o);
    return DiskStore::Open(o).code();
  };
  EXPECT_EQ(with([](DiskStoreOptions& o) { o.bucket_max_keys = 0; }), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(with([](DiskStoreOptions& o) { o.bucket_max_keys = 1u << 24; }), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(with([](DiskStoreOptions& o) { o.bucket_max_bytes = 100; }), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(with([](DiskStoreOptions& o) { o.queue_depth = 0; }), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(with([](DiskStoreOptions& o) { o.queue_depth = 100000; }), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(with([](DiskStoreOptions& o) { o.max_object_size = 5ull << 30; }), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(ParseBackend("lsm").code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(*ParseBackend("file-per-key"), DiskBackend::kFilePerKey);
  EXPECT_EQ(ParseEvictionPolicy("random").code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(*ParseEvictionPolicy("lru"), EvictionPolicy::kLru);
}

TEST(DiskOpenTest, LocationsStayValidWhenReopenedWithOtherLimits) {
  TempDir dir;
  DiskStoreOptions o = TornOptions(dir.path(), DiskBackend::kBucket);
  o.bucket_max_keys = 8;
  std::vector<StoredObject> objects;
  {
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    objects = WriteKeys(**store, {"s0", "s1", "s2", "s3", "s4"}, 5000);  // slots 0..4 of bucket 1
  }
  o.bucket_max_keys = 2;
  o.eviction = EvictionPolicy::kLru;
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(CheckReadable(**store, objects), "") << "slot 4 is valid although the limit is now 2";
  EXPECT_TRUE((*store)->Remove("s4", objects[4].location).ok());
}

size_t OpenDescriptors() {
  size_t n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc/self/fd", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    ++n;
  }
  return n;
}

TEST(DiskBucketTest, CachedDescriptorsAreBounded) {
  TempDir dir;
  DiskStoreOptions o = TornOptions(dir.path(), DiskBackend::kBucket);
  o.bucket_max_keys = 1;  // one bucket per object: 1,200 buckets
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok());
  std::vector<StoredObject> objects;
  for (int b = 0; b < 12; ++b) {
    std::vector<std::string> keys;
    for (int i = 0; i < 100; ++i) keys.push_back("fd" + std::to_string(b * 100 + i));
    auto more = WriteKeys(**store, keys, 100);
    objects.insert(objects.end(), more.begin(), more.end());
  }
  ASSERT_EQ(objects.size(), 1200u);
  const size_t before = OpenDescriptors();
  EXPECT_EQ(CheckReadable(**store, objects), "");
  const size_t after = OpenDescriptors();
  EXPECT_LE(after, before + 1024) << "a descriptor per bucket read would be 1,200 more";
  EXPECT_GE(after, before + 1000) << "recently read buckets keep theirs";
  EXPECT_EQ(CheckReadable(**store, objects), "") << "dropped handles are reopened";
}

TEST(DiskOpenTest, SyncWritesWriteReadAndRecover) {
  for (DiskBackend backend : {DiskBackend::kBucket, DiskBackend::kFilePerKey, DiskBackend::kOffset}) {
    TempDir dir;
    DiskStoreOptions o = TornOptions(dir.path(), backend);
    o.sync_writes = true;
    std::vector<StoredObject> objects;
    {
      auto store = DiskStore::Open(o);
      ASSERT_TRUE(store.ok());
      objects = WriteKeys(**store, {"s1", "s2", "s3"}, 70000);
      ASSERT_EQ(objects.size(), 3u) << BackendName(backend);
    }
    {
      auto store = DiskStore::Open(o);
      ASSERT_TRUE(store.ok());
      EXPECT_EQ((*store)->ListObjects().size(), 3u) << BackendName(backend);
      EXPECT_EQ(CheckReadable(**store, objects), "") << BackendName(backend);
      ASSERT_TRUE((*store)->Remove("s2").ok()) << BackendName(backend);
    }
    fs::remove(dir.path() + "/offset.index");  // as after a crash: the offset file is scanned
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok());
    EXPECT_EQ((*store)->ListObjects().size(), 2u) << BackendName(backend) << ": s2 stays removed";
    EXPECT_FALSE((*store)->Lookup("s2")) << BackendName(backend);
  }
}

TEST(DiskOpenTest, ReadOnlyDirectoryIsAClearError) {
  TempDir dir;
  if (!dir.Mount("tmpfs", "size=1m", MS_RDONLY)) {
    GTEST_SKIP() << "cannot mount a read-only tmpfs here (and root ignores mode bits)";
  }
  DiskStoreOptions o;
  o.dir = dir.path();
  auto store = DiskStore::Open(o);
  EXPECT_EQ(store.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(store.status().message().find("not writable"), std::string::npos) << store.status().ToString();
}

TEST(DiskOpenTest, FilesystemWithoutODirectFallsBackToBufferedIo) {
  TempDir dir;
  if (!dir.Mount("ramfs", "")) {
    GTEST_SKIP() << "cannot mount ramfs here; the *_buffered store tests still run the buffered path";
  }
  for (DiskBackend backend : {DiskBackend::kBucket, DiskBackend::kFilePerKey, DiskBackend::kOffset}) {
    fs::remove_all(dir.path() + "/buckets");
    fs::remove_all(dir.path() + "/objects");
    fs::remove(dir.path() + "/offset.data");
    fs::remove(dir.path() + "/FORMAT");
    DiskStoreOptions o;
    o.dir = dir.path();
    o.backend = backend;
    o.disk_size = 8 << 20;
    auto store = DiskStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_FALSE((*store)->direct_io()) << "ramfs refuses O_DIRECT";
    auto objects = WriteKeys(**store, {"r1", "r2"}, 70000);
    ASSERT_EQ(objects.size(), 2u);
    EXPECT_EQ(CheckReadable(**store, objects), "");
  }
}

TEST(DiskOpenTest, DefaultBudgetIsEightyPercentOfFreeSpace) {
  TempDir dir;
  DiskStoreOptions o;
  o.dir = dir.path();
  struct statvfs before{};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &before), 0);
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok());
  const double free_bytes = static_cast<double>(before.f_bavail) * before.f_frsize;
  const double capacity = static_cast<double>((*store)->Usage().capacity);
  EXPECT_NEAR(capacity / free_bytes, 0.8, 0.01);
}

TEST(DiskOpenTest, AutoPicksIoUringWhereTheKernelAllowsIt) {
  TempDir dir;
  DiskStoreOptions o;
  o.dir = dir.path();
  o.disk_size = 8 << 20;
  auto store = DiskStore::Open(o);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->io_mode(), UringUsable() ? IoMode::kUring : IoMode::kPosix);
  store->reset();  // one store per directory at a time
  o.io = IoMode::kUring;
  auto uring = DiskStore::Open(o);
  if (UringUsable()) {
    EXPECT_TRUE(uring.ok());
  } else {
    EXPECT_EQ(uring.code(), ErrorCode::INVALID_PARAMS);
  }
}

}  // namespace
}  // namespace granary::disk
