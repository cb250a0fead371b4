// Tests of node::ShmSegment (the node's side) and transfer::ShmMapping (a client's side).
#include "node/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "transfer/shm_mapping.h"

namespace granary {
namespace {

using node::ShmSegment;
using node::ShmSpace;
using transfer::ShmMapping;
using transfer::ShmMappingCache;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Unique per process and call, so parallel test runs never collide.
std::string UniqueName(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "granary-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" + tag;
}

bool ShmExists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

using transfer::kShmHeaderBytes;

TEST(ShmSegmentTest, CreatesSegmentOfExactSizeWithMode0600) {
  const std::string name = UniqueName("create");
  auto seg = ShmSegment::Create(name, 3 * kMiB + 123);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ((*seg)->name(), name);
  EXPECT_EQ((*seg)->size(), 3 * kMiB + 123);
  ASSERT_NE((*seg)->data(), nullptr);
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
  // A header page, then exactly the data area the master allocates in.
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kShmHeaderBytes + 3 * kMiB + 123);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, getuid());
  // The whole range is usable, up to the last byte.
  (*seg)->data()[0] = 1;
  (*seg)->data()[(*seg)->size() - 1] = 2;
  EXPECT_EQ((*seg)->data()[(*seg)->size() - 1], 2);
}

TEST(ShmSegmentTest, RejectsInvalidNamesAndZeroSize) {
  for (const std::string& bad :
       {std::string(), std::string("a/b"), std::string("/lead"), std::string("."),
        std::string(".."), std::string("sp ace"), std::string("uml\xc3\xa4ut"),
        std::string(201, 'x'), std::string("tab\t")}) {
    auto seg = ShmSegment::Create(bad, kMiB);
    EXPECT_EQ(seg.code(), ErrorCode::INVALID_PARAMS) << "name '" << bad << "'";
    EXPECT_NE(seg.status().message().find("[A-Za-z0-9._-]"), std::string::npos);
    auto att = ShmMapping::Attach(bad, kMiB);
    EXPECT_EQ(att.code(), ErrorCode::INVALID_PARAMS) << "name '" << bad << "'";
  }
  // The longest legal name works.
  std::string longest = UniqueName("long");
  longest += std::string(200 - longest.size(), 'z');
  auto ok = ShmSegment::Create(longest, 4096);
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ShmSegment::Create(UniqueName("zero"), 0).code(), ErrorCode::INVALID_PARAMS);
}

TEST(ShmSegmentTest, StaleSegmentIsUnlinkedAndRecreated) {
  const std::string name = UniqueName("stale");
  // What a crashed node leaves behind: the name, some bytes, nobody holding its lock.
  int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  ASSERT_EQ(pwrite(fd, "old", 3, 0), 3);
  close(fd);

  auto seg = ShmSegment::Create(name, 2 * kMiB);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kShmHeaderBytes + 2 * kMiB);
  EXPECT_EQ(std::memcmp((*seg)->data(), "\0\0\0", 3), 0) << "old contents survived";
}

TEST(ShmSegmentTest, LiveSegmentOfSameNameIsRefused) {
  const std::string name = UniqueName("live");
  auto first = ShmSegment::Create(name, kMiB);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  (*first)->data()[10] = 42;
  auto second = ShmSegment::Create(name, kMiB);
  EXPECT_EQ(second.code(), ErrorCode::SEGMENT_ALREADY_EXISTS);
  EXPECT_NE(second.status().message().find(name), std::string::npos);
  // The live one is untouched and still reachable by name.
  auto client = ShmMapping::Attach(name, kMiB);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ(static_cast<uint8_t>((*client)->data()[10]), 42);
}

TEST(ShmSegmentTest, DestructionUnlinksButAttachedMappingStaysReadable) {
  const std::string name = UniqueName("unlink");
  auto seg = ShmSegment::Create(name, kMiB);
  ASSERT_TRUE(seg.ok());
  (*seg)->data()[5] = 7;
  auto client = ShmMapping::Attach(name, kMiB);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE(ShmExists(name));
  seg = Result<std::unique_ptr<ShmSegment>>(Status(ErrorCode::INTERNAL_ERROR, "reset"));
  EXPECT_FALSE(ShmExists(name));
  EXPECT_EQ(static_cast<uint8_t>((*client)->data()[5]), 7);  // pages live until the last munmap
  EXPECT_EQ(ShmMapping::Attach(name, kMiB).code(), ErrorCode::SEGMENT_NOT_FOUND);
}

TEST(ShmSegmentTest, DestructionNeverUnlinksANewerSegmentOfTheSameName) {
  const std::string name = UniqueName("newer");
  auto old_seg = ShmSegment::Create(name, kMiB);
  ASSERT_TRUE(old_seg.ok());
  // Someone removed the name behind the old node's back and a new node took it.
  ASSERT_EQ(shm_unlink(("/" + name).c_str()), 0);
  auto fresh = ShmSegment::Create(name, 2 * kMiB);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  old_seg = Result<std::unique_ptr<ShmSegment>>(Status(ErrorCode::INTERNAL_ERROR, "reset"));
  EXPECT_TRUE(ShmExists(name));
  EXPECT_TRUE(ShmMapping::Attach(name, 2 * kMiB).ok());
}

TEST(ShmSegmentTest, TooSmallShmGivesActionableMessage) {
  const std::string name = UniqueName("small");
  ShmSegment::Options options;
  options.space_probe = [](const std::string& dir) -> Result<ShmSpace> {
    EXPECT_EQ(dir, "/dev/shm");
    return ShmSpace{64 * kMiB, 64 * kMiB};  // Docker's default /dev/shm, empty
  };
  auto seg = ShmSegment::Create(name, 1024 * kMiB, options);
  ASSERT_EQ(seg.code(), ErrorCode::INVALID_PARAMS);
  const std::string& msg = seg.status().message();
  // 1 GiB of segment plus its 4 KiB header page: 1025 MiB, rounded up.
  for (const char* part :
       {"1 GiB", "64 MiB free", "/dev/shm", "docker run --shm-size=1025m",
        "emptyDir: {medium: Memory, sizeLimit: 1025Mi}", "smaller --segment-size", name.c_str()}) {
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' missing from: " << msg;
  }
  EXPECT_FALSE(ShmExists(name)) << "a refused segment must not be left behind";

  // Space already used by others counts: 54 MiB used + 100 MiB + the header page = 155 MiB.
  options.space_probe = [](const std::string&) -> Result<ShmSpace> {
    return ShmSpace{10 * kMiB, 64 * kMiB};
  };
  auto used = ShmSegment::Create(name, 100 * kMiB, options);
  ASSERT_EQ(used.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(used.status().message().find("--shm-size=155m"), std::string::npos)
      << used.status().message();
  EXPECT_NE(used.status().message().find("at most 10 MiB fits"), std::string::npos);

  // A failing probe is reported, not ignored.
  options.space_probe = [](const std::string&) -> Result<ShmSpace> {
    return Status(ErrorCode::INTERNAL_ERROR, "statvfs(/dev/shm) failed: test");
  };
  EXPECT_EQ(ShmSegment::Create(name, kMiB, options).code(), ErrorCode::INTERNAL_ERROR);
}

TEST(ShmSegmentTest, ShmDirIsUsedForTheRealFreeSpaceCheck) {
  auto space = ShmSegment::StatSpace("/dev/shm");
  ASSERT_TRUE(space.ok()) << space.status().ToString();
  EXPECT_GT(space->total_bytes, 0u);
  EXPECT_EQ(ShmSegment::StatSpace("/nonexistent-granary-dir").code(), ErrorCode::INTERNAL_ERROR);
  ShmSegment::Options options;
  options.shm_dir = "/nonexistent-granary-dir";
  EXPECT_EQ(ShmSegment::Create(UniqueName("dir"), kMiB, options).code(), ErrorCode::INTERNAL_ERROR);
}

TEST(ShmSegmentTest, PrefaultReservesEveryPageUpFront) {
  const std::string lazy_name = UniqueName("lazy");
  auto lazy = ShmSegment::Create(lazy_name, 4 * kMiB);
  ASSERT_TRUE(lazy.ok());
  const std::string name = UniqueName("prefault");
  auto seg = ShmSegment::Create(name, 4 * kMiB, /*prefault=*/true);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, kShmHeaderBytes + 4 * kMiB);
  ASSERT_EQ(stat(("/dev/shm/" + lazy_name).c_str(), &st), 0);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, kMiB) << "lazy segment was populated";
  EXPECT_EQ((*seg)->data()[4 * kMiB - 1], 0);
}

TEST(ShmMappingTest, AttachWithWrongSizeNamesBothSizes) {
  const std::string name = UniqueName("size");
  auto seg = ShmSegment::Create(name, 2 * kMiB);
  ASSERT_TRUE(seg.ok());
  auto att = ShmMapping::Attach(name, 3 * kMiB);
  ASSERT_EQ(att.code(), ErrorCode::INVALID_PARAMS);
  const std::string& msg = att.status().message();
  EXPECT_NE(msg.find(std::to_string(2 * kMiB)), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(3 * kMiB)), std::string::npos) << msg;
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
}

TEST(ShmMappingTest, AttachRefusesAFileWithoutASegmentHeader) {
  // Not "granary-*": a reclaim scan of a test running in parallel must not take it.
  const std::string name = "gtest-foreign-" + std::to_string(getpid());
  int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kShmHeaderBytes + kMiB)), 0);
  close(fd);
  auto att = ShmMapping::Attach(name, kMiB);
  EXPECT_EQ(att.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(att.status().message().find("header"), std::string::npos) << att.status().ToString();
  shm_unlink(("/" + name).c_str());
}

// Issue 13: the segment's header carries the current mount's token, rewritten at every mount;
// a client sees the new one at once through its existing mapping, and a mapping of a file that
// a new node of the same name replaced reports itself gone.
TEST(ShmMappingTest, HeaderTokenIsPublishedAndReplacedFilesAreDetected) {
  const std::string name = UniqueName("token");
  auto seg = ShmSegment::Create(name, kMiB);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ((*seg)->token(), 0u) << "no mount yet";
  auto client = ShmMapping::Attach(name, kMiB);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->token(), 0u);
  (*seg)->PublishToken(0x1111);
  EXPECT_EQ((*client)->token(), 0x1111u);
  (*seg)->PublishToken(0x2222);  // a remount
  EXPECT_EQ((*client)->token(), 0x2222u);
  EXPECT_TRUE((*client)->StillLinked());
  // The data area starts after the header: replica offset 0 is data()[0] on both sides.
  (*seg)->data()[0] = 0x5a;
  EXPECT_EQ(static_cast<uint8_t>((*client)->data()[0]), 0x5a);

  // The node restarts under the same name: a new file, whose header the old mapping never sees.
  seg = Result<std::unique_ptr<ShmSegment>>(Status(ErrorCode::INTERNAL_ERROR, "reset"));
  auto restarted = ShmSegment::Create(name, kMiB);
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  (*restarted)->PublishToken(0x3333);
  EXPECT_FALSE((*client)->StillLinked());
  EXPECT_EQ((*client)->token(), 0x2222u);
  auto fresh = ShmMapping::Attach(name, kMiB);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->token(), 0x3333u);
  EXPECT_TRUE((*fresh)->StillLinked());
}

// The mount fence on the same-host path: a remount gives the segment a new file under the same
// name. A client paused mid-copy with a mapping of the old file resumes into memory nobody will
// hand out again, never into the new mount's; the old file's pages are released at once even
// though the client still maps it; and the node still holds the name (a second node of the same
// name is refused).
TEST(ShmSegmentTest, RenewGivesANewFileAndALateWriterOnlyTouchesTheRetiredOne) {
  const std::string name = UniqueName("renew");
  constexpr uint64_t kSize = 8 * kMiB;
  auto seg = ShmSegment::Create(name, kSize, /*prefault=*/true);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  (*seg)->PublishToken(0x1111);
  auto late = ShmMapping::Attach(name, kSize);  // a same-host writer of the first mount
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  ASSERT_EQ((*late)->token(), 0x1111u);  // its check before the copy passes
  std::memset((*late)->data(), 0x77, kSize / 2);  // the first half of its copy
  const int old_fd = open(("/dev/shm/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(old_fd, 0);

  auto renewed = (*seg)->Renew();
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  std::unique_ptr<ShmSegment> next = std::move(*renewed);
  EXPECT_TRUE((*seg)->retired());
  EXPECT_EQ((*late)->token(), transfer::kShmRetiredToken);
  EXPECT_TRUE((*late)->retired());
  EXPECT_FALSE((*late)->StillLinked()) << "the name should refer to the new file";
  EXPECT_EQ(next->name(), name);
  EXPECT_EQ(next->size(), kSize);
  EXPECT_EQ(next->token(), 0u);
  // The retired file's data pages went back to the system although a client maps it.
  struct stat st {};
  ASSERT_EQ(fstat(old_fd, &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_blocks) * 512, kShmHeaderBytes + 64 * 1024)
      << "the retired file still holds its pages";
  close(old_fd);
  // With prefault the new file reserves its pages like the first did.
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, kSize);

  next->PublishToken(0x2222);  // the new mount; the master hands its space out
  std::memset(next->data(), 0x11, kSize);
  std::memset((*late)->data() + kSize / 2, 0x77, kSize / 2);  // the writer resumes
  for (uint64_t i = 0; i < kSize; i += 4096) {
    ASSERT_EQ(next->data()[i], 0x11) << "a late writer of the old mount reached the new one";
  }
  // A new attach gets the new file; a retired one is refused.
  auto now = ShmMapping::Attach(name, kSize);
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ((*now)->token(), 0x2222u);
  EXPECT_EQ(static_cast<uint8_t>((*now)->data()[0]), 0x11);
  // The node still holds the name: another node of the same name is refused.
  auto twin = ShmSegment::Create(name, kSize);
  EXPECT_EQ(twin.status().code(), ErrorCode::SEGMENT_ALREADY_EXISTS) << twin.status().ToString();
  // The retired object goes without touching the name; the current one unlinks it.
  seg = Result<std::unique_ptr<ShmSegment>>(Status(ErrorCode::INTERNAL_ERROR, "reset"));
  EXPECT_TRUE(ShmExists(name));
  next.reset();
  EXPECT_FALSE(ShmExists(name));
  // No temporary file was left behind.
  const std::string temp_prefix = "granary-renew-" + std::to_string(getpid()) + "-";
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir)) {
      EXPECT_NE(std::string(e->d_name).rfind(temp_prefix, 0), 0u) << e->d_name;
    }
    closedir(dir);
  }
}

TEST(ShmMappingTest, CacheRetainDropsMappingsOfVanishedAndReplacedSegments) {
  const std::string kept = UniqueName("kept");
  const std::string vanished = UniqueName("vanished");
  const std::string replaced = UniqueName("replaced");
  auto a = ShmSegment::Create(kept, kMiB);
  auto b = ShmSegment::Create(vanished, kMiB);
  auto c = ShmSegment::Create(replaced, kMiB);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ShmMappingCache cache;
  ASSERT_TRUE(cache.Get(kept, kMiB).ok());
  ASSERT_TRUE(cache.Get(vanished, kMiB).ok());
  ASSERT_TRUE(cache.Get(replaced, kMiB).ok());
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.Retain({kept, vanished, replaced}), 0u);
  EXPECT_EQ(cache.size(), 3u);
  c = Result<std::unique_ptr<ShmSegment>>(Status(ErrorCode::INTERNAL_ERROR, "reset"));
  auto c2 = ShmSegment::Create(replaced, kMiB);  // same name, new file
  ASSERT_TRUE(c2.ok());
  // `vanished` is no longer a live segment; `replaced` still is, but our mapping is of its old file.
  EXPECT_EQ(cache.Retain({kept, replaced}), 2u);
  EXPECT_EQ(cache.size(), 1u);
  auto again = cache.Get(kept, kMiB);
  ASSERT_TRUE(again.ok());
}

// Issue 13: a node killed with -9 leaves its file; any node on the host reclaims it once its lock
// is free, and never one whose owner still holds it or a file too young to judge (created, not yet
// locked). Runs in a private directory: files of other tests running now are never touched.
TEST(ShmSegmentTest, ReclaimOrphansRemovesOnlyUnlockedOldSegmentFiles) {
  char dir_template[] = "/tmp/granary-reclaim-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  auto make = [&](const std::string& name) {
    int fd = open((dir + "/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << name;
    EXPECT_EQ(ftruncate(fd, 8192), 0);
    return fd;
  };
  auto exists = [&](const std::string& name) {
    struct stat st {};
    return stat((dir + "/" + name).c_str(), &st) == 0;
  };
  close(make("granary-orphan"));     // its node died: nobody holds the lock
  int live = make("granary-live");   // its node runs (or is stopped): holds the lock
  ASSERT_EQ(flock(live, LOCK_EX | LOCK_NB), 0);
  close(make("other-program"));      // not ours by name

  EXPECT_EQ(ShmSegment::ReclaimOrphans(dir, std::chrono::seconds(3600)), 0u) << "too young";
  EXPECT_TRUE(exists("granary-orphan"));
  EXPECT_EQ(ShmSegment::ReclaimOrphans(dir, std::chrono::seconds(0)), 1u);
  EXPECT_FALSE(exists("granary-orphan"));
  EXPECT_TRUE(exists("granary-live"));
  EXPECT_TRUE(exists("other-program"));
  close(live);  // the owner is gone now
  EXPECT_EQ(ShmSegment::ReclaimOrphans(dir, std::chrono::seconds(0)), 1u);
  EXPECT_FALSE(exists("granary-live"));
  unlink((dir + "/other-program").c_str());
  rmdir(dir.c_str());
}

TEST(ShmMappingTest, AttachToMissingNameIsSegmentNotFound) {
  const std::string name = UniqueName("missing");
  auto att = ShmMapping::Attach(name, kMiB);
  ASSERT_EQ(att.code(), ErrorCode::SEGMENT_NOT_FOUND);
  EXPECT_NE(att.status().message().find(name), std::string::npos);
  EXPECT_FALSE(ShmExists(name)) << "attach must never create";
}

TEST(ShmMappingTest, NodeAndClientSeeEachOthersWrites) {
  const std::string name = UniqueName("shared");
  auto seg = ShmSegment::Create(name, 4 * kMiB);
  ASSERT_TRUE(seg.ok());
  auto client = ShmMapping::Attach(name, 4 * kMiB);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_NE(static_cast<void*>((*client)->data()), static_cast<void*>((*seg)->data()));
  std::memcpy((*seg)->data() + 100, "from node", 9);
  EXPECT_EQ(std::memcmp((*client)->data() + 100, "from node", 9), 0);
  std::memcpy((*client)->data() + 4 * kMiB - 11, "from client", 11);
  EXPECT_EQ(std::memcmp((*seg)->data() + 4 * kMiB - 11, "from client", 11), 0);
  // The client never unlinks: dropping it leaves the node's segment in place.
  client = Result<std::unique_ptr<ShmMapping>>(Status(ErrorCode::INTERNAL_ERROR, "reset"));
  EXPECT_TRUE(ShmExists(name));
}

TEST(ShmMappingTest, CacheMapsOnceAndDropKeepsHoldersSafe) {
  const std::string name = UniqueName("cache");
  auto seg = ShmSegment::Create(name, kMiB);
  ASSERT_TRUE(seg.ok());
  ShmMappingCache cache;
  auto a = cache.Get(name, kMiB);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = cache.Get(name, kMiB);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Get(name, 2 * kMiB).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(cache.Get(UniqueName("nope"), kMiB).code(), ErrorCode::SEGMENT_NOT_FOUND);

  std::shared_ptr<ShmMapping> held = *a;
  cache.Drop(name);
  EXPECT_EQ(cache.size(), 0u);
  (*seg)->data()[3] = 9;
  EXPECT_EQ(static_cast<uint8_t>(held->data()[3]), 9) << "a dropped mapping must stay mapped";
  auto c = cache.Get(name, kMiB);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->get(), held.get());
  cache.Drop("never-seen");  // harmless
}

// Several processes attach the same segment and each writes then verifies its own range while the
// others do the same; the node's view must hold every range.
TEST(ShmMappingTest, ForkedWorkersWriteDisjointRangesConcurrently) {
  constexpr int kWorkers = 4;
  constexpr uint64_t kRange = 2 * kMiB;
  const std::string name = UniqueName("fork");
  auto seg = ShmSegment::Create(name, kWorkers * kRange);
  ASSERT_TRUE(seg.ok());
  auto pattern = [](int worker, uint64_t i) {
    return static_cast<uint8_t>((i * 2654435761u >> 7) ^ (worker * 37 + 1));
  };
  int ready_pipe[2];
  ASSERT_EQ(pipe(ready_pipe), 0);
  std::vector<pid_t> pids;
  for (int w = 0; w < kWorkers; ++w) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(ready_pipe[1]);
      char go;
      if (read(ready_pipe[0], &go, 1) != 0) _exit(10);  // released together when the pipe closes
      auto m = ShmMapping::Attach(name, kWorkers * kRange);
      if (!m.ok()) _exit(11);
      auto* base = reinterpret_cast<uint8_t*>((*m)->data()) + w * kRange;
      for (int round = 0; round < 3; ++round) {
        for (uint64_t i = 0; i < kRange; ++i) base[i] = pattern(w, i + round);
        for (uint64_t i = 0; i < kRange; ++i) {
          if (base[i] != pattern(w, i + round)) _exit(12);
        }
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  close(ready_pipe[0]);
  close(ready_pipe[1]);
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  for (int w = 0; w < kWorkers; ++w) {
    const uint8_t* base = (*seg)->data() + w * kRange;
    uint64_t bad = 0;
    for (uint64_t i = 0; i < kRange; ++i) bad += base[i] != pattern(w, i + 2);
    EXPECT_EQ(bad, 0u) << "worker " << w;
  }
}

// The node takes huge pages only where /dev/shm's mount offers them (node/shm_segment.h).
TEST(ShmSegmentTest, ReadsTheHugeOptionOfTheTmpfsMountedAtTheDirectory) {
  const std::string mounts =
      "proc /proc proc rw,nosuid 0 0\n"
      "tmpfs /dev/shm tmpfs rw,relatime,size=24683656k 0 0\n"
      "tmpfs /dev/shm2 tmpfs rw,huge=always 0 0\n"
      "tmpfs /run tmpfs rw,size=100k,huge=advise,mode=755 0 0\n"
      "ext4 /data ext4 rw,huge=advise 0 0\n";
  EXPECT_EQ(node::TmpfsHugeOption(mounts, "/dev/shm"), "never");
  EXPECT_EQ(node::TmpfsHugeOption(mounts, "/dev/shm2"), "always");
  EXPECT_EQ(node::TmpfsHugeOption(mounts, "/run"), "advise");
  EXPECT_EQ(node::TmpfsHugeOption(mounts, "/data"), "never") << "not a tmpfs";
  EXPECT_EQ(node::TmpfsHugeOption(mounts, "/nowhere"), "never");
  // A later mount over the same directory hides the earlier one.
  EXPECT_EQ(node::TmpfsHugeOption(mounts + "tmpfs /dev/shm tmpfs rw,huge=within_size 0 0", "/dev/shm"),
            "within_size");
  EXPECT_EQ(node::TmpfsHugeOption("", "/dev/shm"), "never");
}

uint64_t ResidentBytes(const std::string& name) {
  struct stat st {};
  if (stat(("/dev/shm/" + name).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Under huge=advise the prefault populates the mapping (MADV_POPULATE_WRITE) instead of
// fallocate; the pages are reserved either way.
TEST(ShmSegmentTest, HugeAdvisePrefaultPopulatesEveryPage) {
  ShmSegment::Options options;
  options.prefault = true;
  options.huge_option = "advise";
  int populates = 0;
  options.populate = [&](void* addr, size_t len) {
    ++populates;
    return madvise(addr, len, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
  };
  const std::string name = UniqueName("huge-populate");
  auto seg = ShmSegment::Create(name, 4 * kMiB, options);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(populates, 1);
  EXPECT_GE(ResidentBytes(name), kShmHeaderBytes + 4 * kMiB);
}

// A kernel before 5.14 answers MADV_POPULATE_WRITE with EINVAL: the node still reserves every
// page (fallocate), so a full /dev/shm fails at start, never with a SIGBUS later.
TEST(ShmSegmentTest, HugeAdvisePrefaultFallsBackToReservingOnAnOldKernel) {
  ShmSegment::Options options;
  options.prefault = true;
  options.huge_option = "advise";
  options.populate = [](void*, size_t) { return EINVAL; };
  const std::string name = UniqueName("huge-old-kernel");
  auto seg = ShmSegment::Create(name, 4 * kMiB, options);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_GE(ResidentBytes(name), kShmHeaderBytes + 4 * kMiB);
}

// A populate that finds the tmpfs full (ENOMEM) is the actionable "no room" error, and leaves
// no file behind.
TEST(ShmSegmentTest, HugeAdvisePrefaultOnAFullTmpfsFailsWithNoRoomAndLeavesNothing) {
  ShmSegment::Options options;
  options.prefault = true;
  options.huge_option = "advise";
  options.populate = [](void*, size_t) { return ENOMEM; };
  const std::string name = UniqueName("huge-full");
  auto seg = ShmSegment::Create(name, 4 * kMiB, options);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), ErrorCode::INVALID_PARAMS) << seg.status().ToString();
  EXPECT_NE(seg.status().message().find("/dev/shm"), std::string::npos) << seg.status().ToString();
  EXPECT_FALSE(ShmExists(name));
}

}  // namespace
}  // namespace granary
