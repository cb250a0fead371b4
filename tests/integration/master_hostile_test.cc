// Integration tests of the master against malformed and hostile requests: every one gets an error
// code (per key or per call), none crashes or stalls the master, and it keeps serving afterwards.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "master_fixture.h"

namespace granary::it {
namespace {

using std::chrono::steady_clock;

int64_t MsSince(steady_clock::time_point t) {
  return std::chrono::duration_cast<Millis>(steady_clock::now() - t).count();
}

std::vector<std::string> NumberedKeys(const std::string& prefix, size_t n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  char buf[32];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof(buf), "%06zu", i);
    keys.push_back(prefix + buf);
  }
  return keys;
}

// Sends raw bytes to a port and closes.
void SendGarbage(uint16_t port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(Millis(50));
  }
  ::close(fd);
}

class MasterHostileTest : public MasterTest {};

TEST_F(MasterHostileTest, EmptyAndOversizedKeysAreInvalidKey) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient c = Client("client-a");

  const std::string huge(100 * KiB, 'k');
  const std::string just_over(4097, 'k');
  for (const std::string& key : {std::string(), huge, just_over}) {
    SCOPED_TRACE("key of " + std::to_string(key.size()) + " bytes");
    auto put = c.PutStartOne(key, 4096);
    EXPECT_EQ(put.code(), code::kInvalidKey);
    EXPECT_FALSE(put.message().empty());
    EXPECT_EQ(put.replicas_size(), 0);
    EXPECT_EQ(c.GetOne(key).code(), code::kInvalidKey);
    EXPECT_EQ(c.ExistOne(key), code::kInvalidKey);
    EXPECT_EQ(c.GetSize({key}), std::vector<int64_t>{code::kInvalidKey});
    EXPECT_EQ(c.RemoveOne(key), code::kInvalidKey);
    EXPECT_EQ(c.Stat(key).code(), code::kInvalidKey);
    EXPECT_EQ(c.PrefixMatch({key}).matched(), 0u);
  }
  // The limit itself is a valid key.
  const std::string longest(4096, 'k');
  EXPECT_EQ(c.Put(longest, 4096), code::kOk);
  EXPECT_EQ(c.ExistOne(longest), 1);
  // A bad key in a batch fails alone.
  auto mixed = c.PutStart({"good", ""}, {64, 64});
  ASSERT_EQ(mixed.results_size(), 2);
  EXPECT_EQ(mixed.results(0).code(), code::kOk);
  EXPECT_EQ(mixed.results(1).code(), code::kInvalidKey);
  ExpectServing();
}

TEST_F(MasterHostileTest, SizeZeroAndHugeSizesAreInvalidParams) {
  ASSERT_TRUE(StartMaster());
  MasterClient node = Client("node-a");
  ASSERT_EQ(node.Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient c = Client("client-a");

  auto batch = c.PutStart({"zero", "two-to-63", "max", "over-1tib", "fine"},
                          {0, uint64_t{1} << 63, UINT64_MAX, (uint64_t{1} << 40) + 1, 64});
  ASSERT_EQ(batch.results_size(), 5);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(batch.results(i).code(), code::kInvalidParams) << "key " << i;
    EXPECT_FALSE(batch.results(i).message().empty());
    EXPECT_EQ(batch.results(i).replicas_size(), 0);
  }
  EXPECT_EQ(batch.results(4).code(), code::kOk);
  pb::SegmentInfo seg;
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  EXPECT_EQ(seg.used_bytes(), 64u) << "only the valid key took space";
  EXPECT_EQ(c.Exist({"zero", "two-to-63", "max", "over-1tib"}), (std::vector<int32_t>{0, 0, 0, 0}));

  // Too many replicas.
  auto many = c.PutStartOne("many-replicas", 64, Replicas(65));
  EXPECT_EQ(many.code(), code::kInvalidParams);
  auto cap = c.PutStartOne("cap-replicas", 64, Replicas(64));
  EXPECT_EQ(cap.code(), code::kOk);
  EXPECT_EQ(cap.replicas_size(), 1);
  ExpectServing();
}

TEST_F(MasterHostileTest, MismatchedBatchLengthsAreInvalidParams) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient c = Client("client-a");

  auto fewer_sizes = c.PutStart({"a", "b"}, {64});
  ASSERT_EQ(fewer_sizes.results_size(), 2) << "one result per key";
  for (const auto& r : fewer_sizes.results()) EXPECT_EQ(r.code(), code::kInvalidParams);
  auto more_sizes = c.PutStart({"a"}, {64, 64, 64});
  ASSERT_EQ(more_sizes.results_size(), 1);
  EXPECT_EQ(more_sizes.results(0).code(), code::kInvalidParams);
  EXPECT_EQ(c.Exist({"a", "b"}), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(c.PutStart({}, {}).results_size(), 0);

  ASSERT_EQ(c.PutStart({"a", "b"}, {64, 64}).results_size(), 2);
  auto fewer_sums = c.PutEnd({"a", "b"}, {1});
  ASSERT_EQ(fewer_sums.results_size(), 2);
  for (const auto& r : fewer_sums.results()) EXPECT_EQ(r.code(), code::kInvalidParams);
  auto no_sums = c.PutEnd({"a", "b"}, {});
  ASSERT_EQ(no_sums.results_size(), 2);
  for (const auto& r : no_sums.results()) EXPECT_EQ(r.code(), code::kInvalidParams);
  EXPECT_EQ(c.GetOne("a").code(), code::kReplicaIsNotReady) << "a refused put-end committed";
  // The correct call still works.
  auto ok = c.PutEnd({"a", "b"}, {1, 2});
  ASSERT_EQ(ok.results_size(), 2);
  EXPECT_EQ(ok.results(0).code(), code::kOk);
  EXPECT_EQ(ok.results(1).code(), code::kOk);
  ExpectServing();
}

TEST_F(MasterHostileTest, UnknownSegmentsAndClients) {
  ASSERT_TRUE(StartMaster());
  MasterClient owner = Client("node-a");
  ASSERT_EQ(owner.Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient a = Client("client-a");
  MasterClient ghost = Client("client-ghost");

  auto unmount = owner.Unmount("no-such-segment");
  EXPECT_EQ(unmount.code(), code::kSegmentNotFound);
  EXPECT_FALSE(unmount.message().empty());
  EXPECT_EQ(ghost.Unmount("seg-a").code(), code::kIllegalClient);
  EXPECT_TRUE(owner.FindSegment("seg-a", nullptr));

  ASSERT_EQ(a.PutStartOne("k", 64).code(), code::kOk);
  // master_state.cc ApplyPutEnd: a pending key ended by anyone but its writer -> ILLEGAL_CLIENT;
  // a key nobody started -> OBJECT_NOT_FOUND.
  EXPECT_EQ(ghost.PutEndOne("k", 1), code::kIllegalClient);
  EXPECT_EQ(ghost.PutRevokeOne("k"), code::kIllegalClient);
  EXPECT_EQ(ghost.PutEndOne("never-started", 1), code::kObjectNotFound);
  ASSERT_EQ(a.PutEndOne("k", 2), code::kOk);
  EXPECT_EQ(ghost.FinishReadOne("k"), code::kLeaseExpired) << "it holds no lock";
  EXPECT_EQ(a.GetOne("k").checksum(), 2u);
  ExpectServing();
}

TEST_F(MasterHostileTest, EmptyClientIdIsRefused) {
  ASSERT_TRUE(StartMaster());
  MasterClient owner = Client("node-a");
  ASSERT_EQ(owner.Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient anon = Client("");
  MasterClient a = Client("client-a");

  EXPECT_EQ(anon.Mount("seg-anon", 1 * MiB).code(), code::kInvalidParams);
  EXPECT_FALSE(owner.FindSegment("seg-anon", nullptr));
  // An empty id must not pass as the master's own (which skips the owner check).
  EXPECT_EQ(anon.Unmount("seg-a").code(), code::kInvalidParams);
  EXPECT_TRUE(owner.FindSegment("seg-a", nullptr));
  EXPECT_EQ(anon.Ping().code(), code::kInvalidParams);

  auto put = anon.PutStart({"k1", "k2"}, {64, 64});
  ASSERT_EQ(put.results_size(), 2);
  for (const auto& r : put.results()) EXPECT_EQ(r.code(), code::kInvalidParams);
  EXPECT_EQ(anon.ExistOne("k1"), 0);

  ASSERT_EQ(a.PutStartOne("k", 64).code(), code::kOk);
  EXPECT_EQ(anon.PutEndOne("k", 1), code::kIllegalClient);
  EXPECT_EQ(anon.PutRevokeOne("k"), code::kIllegalClient);
  ASSERT_EQ(a.PutEndOne("k", 1), code::kOk);
  EXPECT_EQ(anon.GetOne("k").code(), code::kInvalidParams) << "a lock needs an owner";
  EXPECT_EQ(a.Stat("k").read_locks(), 0u);
  ExpectServing();
}

TEST_F(MasterHostileTest, InvalidRegexIsInvalidParamsWithAMessage) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient c = Client("client-a");
  ASSERT_EQ(c.Put("keep-me", 64), code::kOk);

  for (const std::string& pattern :
       {std::string("("), std::string("[z-a]"), std::string("a{2,1}"), std::string("*"),
        std::string("a**"), std::string("(?P<>a)"), std::string("\\"), std::string(5000, 'a')}) {
    SCOPED_TRACE("pattern '" + pattern.substr(0, 20) + "'");
    auto q = c.QueryByRegex(pattern);
    EXPECT_EQ(q.code(), code::kInvalidParams);
    EXPECT_FALSE(q.message().empty());
    EXPECT_EQ(q.objects_size(), 0);
    auto r = c.RemoveByRegex(pattern, /*force=*/true);
    EXPECT_EQ(r.code(), code::kInvalidParams);
    EXPECT_FALSE(r.message().empty());
    EXPECT_EQ(r.removed(), 0u);
  }
  EXPECT_EQ(c.ExistOne("keep-me"), 1);
  ExpectServing();
}

TEST_F(MasterHostileTest, PathologicalRegexOverAHundredThousandKeysReturnsQuickly) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-big", 16 * MiB).code(), code::kOk);
  MasterClient c = Client("client-a");

  // Keys full of 'a' and without a 'b': the worst case of a backtracking engine for (a*)*b.
  const std::string prefix(40, 'a');
  const std::vector<std::string> keys = NumberedKeys(prefix + "-", 100'000);
  for (size_t i = 0; i < keys.size(); i += 1000) {
    std::vector<std::string> batch(keys.begin() + i, keys.begin() + i + 1000);
    ASSERT_NO_FATAL_FAILURE(c.PutMany(batch, 64));
  }
  ASSERT_EQ(c.Exist({keys.front(), keys.back()}), (std::vector<int32_t>{1, 1}));

  c.set_deadline(Millis(5000));  // "a few seconds"
  auto t0 = steady_clock::now();
  auto q = c.QueryByRegex("(a*)*b");
  ASSERT_TRUE(c.last_status().ok()) << "QueryByRegex did not return within 5 s";
  EXPECT_EQ(q.code(), code::kOk) << q.message();
  EXPECT_EQ(q.objects_size(), 0);
  EXPECT_LT(MsSince(t0), 5000);

  t0 = steady_clock::now();
  auto r = c.RemoveByRegex("(a*)*b");
  ASSERT_TRUE(c.last_status().ok()) << "RemoveByRegex did not return within 5 s";
  EXPECT_EQ(r.code(), code::kOk) << r.message();
  EXPECT_EQ(r.removed(), 0u);
  EXPECT_LT(MsSince(t0), 5000);

  // A nested pattern that does match exactly one key.
  auto one = c.QueryByRegex("(a*)*-012345");
  ASSERT_TRUE(c.last_status().ok());
  ASSERT_EQ(one.objects_size(), 1);
  EXPECT_EQ(one.objects(0).key(), prefix + "-012345");
  EXPECT_EQ(one.objects(0).size(), 64u);

  // Everything, with and without a limit.
  auto limited = c.QueryByRegex(".*", 10);
  EXPECT_EQ(limited.objects_size(), 10);
  EXPECT_TRUE(limited.truncated());
  auto all = c.QueryByRegex("(a+)+-.*");
  ASSERT_TRUE(c.last_status().ok());
  EXPECT_EQ(all.objects_size(), 100'000);
  EXPECT_FALSE(all.truncated());

  c.set_deadline(Millis(10'000));
  ExpectServing();
  EXPECT_EQ(c.ExistOne(keys[777]), 1);
}

TEST_F(MasterHostileTest, PutStartOfMoreKeysThanTheBatchCapIsInvalidParams) {
  ASSERT_TRUE(StartMaster());
  MasterClient node = Client("node-a");
  ASSERT_EQ(node.Mount("seg-a", 16 * MiB).code(), code::kOk);
  MasterClient c = Client("client-a");

  const std::vector<std::string> keys = NumberedKeys("over-cap-", 70'000);
  auto put = c.PutStart(keys, std::vector<uint64_t>(keys.size(), 64));
  ASSERT_EQ(put.results_size(), 70'000) << "one result per key";
  int bad = 0;
  for (const auto& r : put.results()) bad += r.code() == code::kInvalidParams;
  EXPECT_EQ(bad, 70'000);
  EXPECT_NE(put.results(0).message().find("65536"), std::string::npos) << put.results(0).message();
  pb::SegmentInfo seg;
  ASSERT_TRUE(node.FindSegment("seg-a", &seg));
  EXPECT_EQ(seg.used_bytes(), 0u) << "a refused batch allocated space";

  auto prefix = c.PrefixMatch(keys);
  EXPECT_EQ(prefix.code(), code::kInvalidParams);
  EXPECT_FALSE(prefix.message().empty());

  // Exactly at the cap is accepted.
  const std::vector<std::string> at_cap(keys.begin(), keys.begin() + 65'536);
  auto ok = c.PutStart(at_cap, std::vector<uint64_t>(at_cap.size(), 64));
  ASSERT_EQ(ok.results_size(), 65'536);
  int good = 0;
  for (const auto& r : ok.results()) good += r.code() == code::kOk;
  EXPECT_EQ(good, 65'536);
  ExpectServing();
}

// master_state.h: kMaxBatchKeys is a limit "on what a caller may ask for; beyond them a request
// is ... INVALID_PARAMS". Every batch RPC must honour it, not only put-start and prefix-match.
TEST_F(MasterHostileTest, EveryBatchRpcRefusesMoreKeysThanTheCap) {
  ASSERT_TRUE(StartMaster());
  ASSERT_EQ(Client("node-a").Mount("seg-a", 1 * MiB).code(), code::kOk);
  MasterClient c = Client("client-a");
  std::vector<std::string> keys = NumberedKeys("over-cap-", 70'000);
  ASSERT_EQ(c.Put(keys[0], 64), code::kOk);  // one real key among them

  auto all_invalid = [](const auto& results, const char* rpc) {
    EXPECT_EQ(results.size(), 70'000u) << rpc << ": one result per key";
    size_t bad = 0;
    for (const auto& r : results) bad += r == code::kInvalidParams;
    EXPECT_EQ(bad, results.size()) << rpc << " accepted a batch of 70,000 keys";
  };
  auto codes = [](const pb::BatchStatusResponse& resp) {
    std::vector<int32_t> out;
    for (const auto& r : resp.results()) out.push_back(r.code());
    return out;
  };

  all_invalid(c.Exist(keys), "BatchExist");
  all_invalid(c.GetSize(keys), "BatchGetSize");
  {
    auto got = c.Get(keys);
    std::vector<int32_t> out;
    for (const auto& r : got.results()) out.push_back(r.code());
    all_invalid(out, "BatchGetReplicaList");
  }
  all_invalid(codes(c.FinishRead(keys)), "BatchFinishRead");
  all_invalid(codes(c.PutEnd(keys, std::vector<uint64_t>(keys.size(), 1))), "BatchPutEnd");
  all_invalid(codes(c.PutRevoke(keys)), "BatchPutRevoke");
  all_invalid(codes(c.Remove(keys)), "BatchRemove");
  ExpectServing();
}

TEST_F(MasterHostileTest, MountOfAbsurdSizesIsInvalidParams) {
  ASSERT_TRUE(StartMaster());
  MasterClient node = Client("node-a");
  for (uint64_t size : {uint64_t{0}, uint64_t{63}, uint64_t{1} << 63, UINT64_MAX}) {
    auto r = node.Mount("seg-absurd", size);
    EXPECT_EQ(r.code(), code::kInvalidParams) << "size " << size;
    EXPECT_FALSE(r.message().empty());
  }
  EXPECT_EQ(node.Mount("", 1 * MiB).code(), code::kInvalidParams) << "empty segment name";
  EXPECT_EQ(node.ListSegments().segments_size(), 0);
  // The smallest legal segment works.
  EXPECT_EQ(node.Mount("seg-tiny", 64).code(), code::kOk);
  EXPECT_EQ(Client("client-a").Put("tiny", 64), code::kOk);
  ExpectServing();
}

TEST_F(MasterHostileTest, GarbageOnBothPortsLeavesTheMasterServing) {
  ASSERT_TRUE(StartMaster());
  std::string junk(4096, '\0');
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 131 + 7);
  ASSERT_NO_FATAL_FAILURE(SendGarbage(master_.grpc_port(), junk));
  ASSERT_NO_FATAL_FAILURE(SendGarbage(master_.grpc_port(), "GET / HTTP/1.1\r\n\r\n"));
  ASSERT_NO_FATAL_FAILURE(SendGarbage(master_.http_port(), junk));
  ASSERT_NO_FATAL_FAILURE(
      SendGarbage(master_.http_port(), "GET /" + std::string(100'000, 'x') + " HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(HttpGet(master_.http_port(), "/health").status, 200);
  ExpectServing();
}

}  // namespace
}  // namespace granary::it
