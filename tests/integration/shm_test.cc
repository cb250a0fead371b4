// The node's shared-memory segment as an operator meets it: /dev/shm too small, a segment left
// behind by a crashed node, a name already taken, and several client processes on one host
// moving bytes through the same segment at once.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

uint64_t ShmFreeBytes() {
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) != 0) return 0;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

TEST(ShmTest, SegmentLargerThanDevShmFailsWithActionableMessage) {
  const uint64_t free_bytes = ShmFreeBytes();
  ASSERT_GT(free_bytes, 0u) << "/dev/shm is not mounted";
  ASSERT_LT(free_bytes, uint64_t{100} << 40) << "this host's /dev/shm holds 100 TB";
  TempDir dir("granary-it-shm");
  const std::string name = UniqueName("too-big");
  ChildProcess node;
  std::string error;
  // No master is needed: the segment is created before the node talks to one.
  ASSERT_TRUE(node.Start(BinaryPath("granary-node"),
                         {"--master", "127.0.0.1:1", "--segment-size", "100TB", "--name", name,
                          "--host", "127.0.0.1", "--port", "0"},
                         dir.File("node.log"), &error))
      << error;
  auto exited = node.Wait(Millis(10'000));
  ASSERT_TRUE(exited.has_value()) << "granary-node kept running with a 100 TB segment";
  EXPECT_FALSE(exited->Succeeded()) << exited->ToString();
  EXPECT_TRUE(exited->exited) << "crashed instead of exiting: " << exited->ToString();
  const std::string log = node.LogContents();
  EXPECT_NE(log.find("/dev/shm"), std::string::npos) << "message does not name /dev/shm:\n" << log;
  EXPECT_NE(log.find("--shm-size"), std::string::npos)
      << "message does not say how to enlarge it (--shm-size):\n" << log;
  EXPECT_NE(log.find("--segment-size"), std::string::npos)
      << "message does not offer a smaller --segment-size:\n" << log;
  EXPECT_EQ(log.find("granary-node ready"), std::string::npos) << log;
  struct stat st {};
  EXPECT_NE(::stat(("/dev/shm/granary-" + name).c_str(), &st), 0) << "a failed start left a segment";
}

class ShmStoreTest : public StoreTest {};

TEST_F(ShmStoreTest, StaleSegmentIsReplacedAtStart) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  const std::string name = UniqueName("stale");
  const std::string shm_name = "/granary-" + name;
  // What a SIGKILLed node leaves behind: the named segment, with nobody holding it.
  int fd = ::shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << "shm_open " << shm_name << ": " << std::strerror(errno);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  ASSERT_EQ(::write(fd, "stale bytes", 11), 11);
  ::close(fd);

  ASSERT_TRUE(cluster_.AddNode(32 * MiB, name)) << "a stale segment blocked the node's start";
  NodeProcess& node = cluster_.node(0);
  struct stat st {};
  ASSERT_EQ(::stat(node.ShmPath().c_str(), &st), 0);
  // The segment plus its header page (transfer::ShmSegmentHeader).
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 32 * MiB + 4096) << "the segment was not recreated";

  auto client = cluster_.MakeClient(true);
  ASSERT_NE(client, nullptr);
  const auto value = testdata::Pattern("through-recreated", 3 * MiB + 11);
  ASSERT_TRUE(client->Put("through-recreated", ByteSpan(value)).ok());
  auto got = client->Get("through-recreated");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
}

TEST_F(ShmStoreTest, SecondNodeWithSameNameIsRefusedAndFirstKeepsServing) {
  ASSERT_TRUE(cluster_.Start(1, 32 * MiB));
  NodeProcess& first = cluster_.node(0);
  TempDir dir("granary-it-dup");
  ChildProcess second;
  std::string error;
  ASSERT_TRUE(second.Start(BinaryPath("granary-node"),
                           {"--master", cluster_.master_address(), "--segment-size", "32MB",
                            "--name", first.name(), "--host", "127.0.0.1", "--port", "0"},
                           dir.File("second.log"), &error))
      << error;
  auto exited = second.Wait(Millis(10'000));
  ASSERT_TRUE(exited.has_value()) << "a second node with a taken name kept running";
  EXPECT_TRUE(exited->exited && exited->code != 0) << exited->ToString();
  EXPECT_NE(second.LogContents().find(first.name()), std::string::npos) << second.LogContents();

  EXPECT_TRUE(first.Running());
  struct stat st {};
  EXPECT_EQ(::stat(first.ShmPath().c_str(), &st), 0) << "the refused node removed the live segment";
  auto client = cluster_.MakeClient(true);
  ASSERT_NE(client, nullptr);
  const auto value = testdata::Pattern("still-served", 100 * KiB);
  ASSERT_TRUE(client->Put("still-served", ByteSpan(value)).ok());
  auto got = client->Get("still-served");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_LT(testdata::FirstDifference(*got, value), 0);
}

// ClientOptions::warm_shared_memory: Connect maps this host's segments and populates them in the
// background (the whole segment, once); with it off nothing is populated. Bytes are right either way.
TEST_F(ShmStoreTest, ConnectWarmsThisHostsSegmentsInTheBackgroundUnlessTurnedOff) {
  ASSERT_TRUE(cluster_.Start(2, 96 * MiB));
  for (bool warm : {true, false}) {
    ClientOptions options;
    options.warm_shared_memory = warm;
    auto client = cluster_.MakeClient(true, options);
    ASSERT_NE(client, nullptr);
    if (warm) {
      EXPECT_TRUE(WaitUntil([&] { return client->Stats().shm_bytes_warm_pending == 0 &&
                                         client->Stats().shm_bytes_warmed == 2 * 96 * MiB; },
                            Millis(20'000)))
          << "warmed " << client->Stats().shm_bytes_warmed << " of " << 2 * 96 * MiB;
      EXPECT_EQ(client->Stats().shm_mappings, 2u) << "Connect did not map both local segments";
    }
    const std::string key = warm ? "warm-put" : "cold-put";
    const auto value = testdata::Pattern(key, 5 * MiB + 3);
    ASSERT_TRUE(client->Put(key, ByteSpan(value)).ok());
    auto got = client->Get(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_LT(testdata::FirstDifference(*got, value), 0);
    EXPECT_EQ(client->Stats().shm_bytes_written, value.size()) << "the put did not use shared memory";
    if (!warm) {
      EXPECT_EQ(client->Stats().shm_bytes_warmed, 0u);
      EXPECT_EQ(client->Stats().shm_bytes_warm_pending, 0u);
    }
  }
}

TEST_F(ShmStoreTest, FourWorkerProcessesShareOneSegmentConcurrently) {
  ASSERT_TRUE(cluster_.Start(1, 256 * MiB));
  TempDir dir("granary-it-workers");
  constexpr int kWorkers = 4;
  ChildProcess workers[kWorkers];
  for (int i = 0; i < kWorkers; ++i) {
    std::string error;
    ASSERT_TRUE(workers[i].Start(BinaryPath("granary-test-worker"),
                                 {"worker", "--master", cluster_.master_address(), "--id",
                                  std::to_string(i), "--objects", "40", "--size",
                                  std::to_string(512 * KiB + i), "--require-shm-mapping"},
                                 dir.File("worker-" + std::to_string(i) + ".log"), &error))
        << error;
  }
  for (int i = 0; i < kWorkers; ++i) {
    auto exited = workers[i].Wait(Millis(60'000));
    ASSERT_TRUE(exited.has_value()) << "worker " << i << " still running after 60 s\n"
                                    << workers[i].LogContents();
    EXPECT_TRUE(exited->Succeeded()) << "worker " << i << " " << exited->ToString() << "\n"
                                     << workers[i].LogContents();
  }
  // Every worker's objects are in the store and readable by a process that wrote none of them.
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < kWorkers; ++i) {
    for (int j : {0, 17, 39}) {
      const std::string key = "worker-" + std::to_string(i) + "-" + std::to_string(j);
      auto got = client->Get(key);
      ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
      EXPECT_LT(testdata::FirstDifference(*got, testdata::Pattern(key, 512 * KiB + i)), 0) << key;
    }
  }
}

}  // namespace
}  // namespace granary::it
