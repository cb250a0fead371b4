// Issue 13, section 2 (epochs and fencing), node and client side, with real processes: every
// mount has its own token that the data server and the shared-memory header enforce; a client
// drops mappings of segments that are gone; a read whose lease expired mid-copy is never
// reported as a success; the shared memory of a node killed with -9 is reclaimed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <regex>
#include <thread>

#include "../tools/test_pattern.h"
#include "../unit/dataplane/raw_conn.h"
#include "node/storage_node.h"
#include "store_fixture.h"
#include "transfer/protocol.h"
#include "transfer/tcp_transport.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;

bool FileExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

class FencingTest : public StoreTest {};

// The token the master lists for `segment` now; 0 if it lists none (or does not answer).
uint64_t ListedToken(StoreCluster& cluster, const std::string& segment) {
  auto stub = pb::Master::NewStub(MakeChannel(cluster.master_address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  pb::ListSegmentsResponse list;
  if (!stub->ListSegments(&ctx, pb::ListSegmentsRequest(), &list).ok()) return 0;
  for (const auto& info : list.segments()) {
    if (info.name() == segment) return info.token();
  }
  return 0;
}

// BatchPutStart of one key of `size` bytes, one replica: the range a writer is granted.
std::optional<pb::Replica> GrantRange(StoreCluster& cluster, const std::string& key,
                                      uint64_t size) {
  pb::BatchPutStartRequest req;
  req.set_client_id("fencing-test-writer");
  req.add_keys(key);
  req.add_sizes(size);
  req.mutable_config()->set_replica_num(1);
  pb::BatchPutStartResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!cluster.master().stub()->BatchPutStart(&ctx, req, &resp).ok() ||
      resp.results_size() != 1 || resp.results(0).code() != 0 ||
      resp.results(0).replicas_size() != 1) {
    return std::nullopt;
  }
  return resp.results(0).replicas(0);
}

// After a master restart the node remounts with a new token; waits (bounded) and returns it.
uint64_t WaitForRemount(StoreCluster& cluster, const std::string& segment, uint64_t old_token) {
  uint64_t token = 0;
  WaitUntil(
      [&] {
        token = ListedToken(cluster, segment);
        return token != 0 && token != old_token;
      },
      Millis(10'000), Millis(50));
  return token != old_token ? token : 0;
}

// A client whose puts take the two calls: no space reserved ahead, so on a new master its first
// put gets the segment's first free range.
ClientOptions TwoCallPuts() {
  ClientOptions options;
  options.reserve_bytes = 0;
  return options;
}

// Another client's put of `value` once the remounted segment takes objects (bounded), and where
// it landed.
::testing::AssertionResult PutAfterRemount(Client& client, const std::string& key,
                                           const Bytes& value, ReplicaInfo* where) {
  Status put = Status(ErrorCode::INTERNAL_ERROR, "not tried");
  WaitUntil(
      [&] {
        put = client.Put(key, ByteSpan(value));
        return put.ok();
      },
      Millis(15'000), Millis(100));
  if (!put.ok()) return ::testing::AssertionFailure() << "put after the remount: " << put.ToString();
  auto stat = client.Stat(key);
  if (!stat.ok() || stat->replicas.size() != 1) {
    return ::testing::AssertionFailure() << "stat: " << stat.status().ToString();
  }
  *where = stat->replicas[0];
  return ::testing::AssertionSuccess();
}

// A remount (here: the master restarted and answers NEED_REMOUNT) takes a new token and new
// memory: the node publishes the token in the new segment file's header and its data server,
// tells the master, and from then on refuses a late write that quotes the previous mount's token;
// nothing of the previous mount is in the new memory.
TEST_F(FencingTest, RemountTakesANewTokenAndRefusesThePreviousMountsWrites) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  node::StorageNodeOptions options;
  options.master_address = cluster_.master_address();
  options.segment_name = UniqueName("fence");
  options.segment_size = 4 * MiB;
  options.prefault = false;
  options.heartbeat_interval_ms = 100;
  options.rpc_timeout_ms = 2000;
  auto started = node::StorageNode::Start(options);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  std::unique_ptr<node::StorageNode> node = std::move(*started);
  ASSERT_TRUE(node->mounted());
  const uint64_t first = node->token();
  ASSERT_NE(first, 0u);
  EXPECT_EQ(node->segment()->token(), first) << "the shm header does not carry the mount's token";
  EXPECT_EQ(node->server().token(), first);

  transfer::TcpTransport::Options tcp_options;
  tcp_options.io_timeout_ms = 5000;
  transfer::TcpTransport tcp(tcp_options);
  const Bytes before = testdata::Pattern("fence-before", 64 * KiB);
  ASSERT_TRUE(tcp.Write({node->endpoint(), first, 4096, before.size()}, ByteSpan(before)).ok());

  ASSERT_TRUE(cluster_.RestartMaster());
  ASSERT_TRUE(WaitUntil([&] { return node->token() != first && node->mounted(); }, Millis(10'000)))
      << "the node did not remount with a new token after the master restarted";
  const uint64_t second = node->token();
  EXPECT_EQ(node->segment()->token(), second);
  EXPECT_EQ(node->server().token(), second);

  // A writer of the previous mount, late: refused, and the new memory is untouched (zeros: the
  // remount's memory is new, nothing of the previous mount is in it).
  const Bytes late = testdata::Pattern("fence-late", 64 * KiB);
  Status refused = tcp.Write({node->endpoint(), first, 4096, late.size()}, ByteSpan(late));
  EXPECT_EQ(refused.code(), ErrorCode::SEGMENT_NOT_FOUND) << refused.ToString();
  const Bytes zeros(before.size(), std::byte{0});
  EXPECT_EQ(std::memcmp(node->segment()->data() + 4096, zeros.data(), zeros.size()), 0)
      << "the new mount's memory holds bytes of the previous mount";
  Bytes out(before.size());
  EXPECT_EQ(tcp.Read({node->endpoint(), first, 4096, out.size()}, MutableByteSpan(out)).code(),
            ErrorCode::SEGMENT_NOT_FOUND);
  // The current mount's token works.
  ASSERT_TRUE(tcp.Read({node->endpoint(), second, 4096, out.size()}, MutableByteSpan(out)).ok());
  EXPECT_EQ(out, zeros);

  // The master holds the segment under the new token.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::ListSegmentsResponse list;
  ASSERT_TRUE(cluster_.master().stub()->ListSegments(&ctx, pb::ListSegmentsRequest(), &list).ok());
  ASSERT_EQ(list.segments_size(), 1);
  EXPECT_EQ(list.segments(0).token(), second);
  node->Stop();
}

// The mount fence, TCP side (node/data_server.h). A writer sends a WRITE's header and half its
// payload, then pauses; the master restarts (kill -9), the node remounts, and another client puts
// an object into the very same range of the segment. When the paused writer sends the other
// half - still within its request's deadline, so only the fence can stop it - none of it may
// land: the other object reads back byte-exact. The remount itself does not wait for the paused
// peer. (Before the fence, the data server checked the token once, at the header, and the second
// half overwrote the other object: lost, failing its checksum on every read.)
TEST_F(FencingTest, TcpWriterPausedMidPayloadAcrossAMasterRestartCannotOverwriteTheNextPut) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  // A request deadline far beyond this test's steps: the paused write stays alive until it
  // resumes, as it may in production (10 s plus its bytes at 1 MiB/s; longer than a quarantine).
  ASSERT_TRUE(cluster_.AddNode(8 * MiB, "", {"--data-request-timeout", "120s", "--prefault=false"}));
  const std::string segment = cluster_.node(0).name();
  constexpr uint64_t kSize = 1 * MiB;
  auto granted = GrantRange(cluster_, "paused-tcp", kSize);
  ASSERT_TRUE(granted.has_value());
  const pb::Replica range = *granted;
  ASSERT_EQ(range.segment_name(), segment);

  const std::string& endpoint = range.endpoint();
  granary::testing::RawConn conn(static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1))));
  ASSERT_TRUE(conn.connected());
  transfer::RequestHeader header;
  header.opcode = transfer::Opcode::kWrite;
  header.request_id = 1;
  header.segment_token = range.token();
  header.offset = range.offset();
  header.length = kSize;
  const Bytes stale = testdata::Pattern("paused-tcp-late-bytes", kSize);
  const auto header_sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(conn.SendHeader(header));
  ASSERT_TRUE(conn.Send(stale.data(), kSize / 2));
  std::this_thread::sleep_for(Millis(300));  // the node takes the header and the first half

  ASSERT_TRUE(cluster_.RestartMaster());
  const auto restarted = std::chrono::steady_clock::now();
  const uint64_t token = WaitForRemount(cluster_, segment, range.token());
  ASSERT_NE(token, 0u) << "the node did not remount after the master restarted";
  EXPECT_LT(std::chrono::steady_clock::now() - restarted, Millis(5000))
      << "the remount waited for the paused writer";

  auto other = cluster_.MakeClient(false, TwoCallPuts());
  ASSERT_NE(other, nullptr);
  const Bytes value = testdata::Pattern("put-after-remount", kSize);
  ReplicaInfo where;
  ASSERT_TRUE(PutAfterRemount(*other, "after-remount", value, &where));
  // The same range as the paused write's, or this test would prove nothing.
  ASSERT_EQ(where.segment_name, segment);
  ASSERT_EQ(where.offset, range.offset());

  ASSERT_LT(std::chrono::steady_clock::now() - header_sent, Millis(100'000))
      << "too slow: the paused write's own deadline could have cut it off";
  ASSERT_TRUE(conn.Send(stale.data() + kSize / 2, kSize - kSize / 2));  // the writer resumes
  auto answer = conn.RecvResponse();
  ASSERT_TRUE(answer.has_value()) << "no answer to the paused write";
  EXPECT_EQ(answer->status, static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND))
      << "the paused write was not refused";

  auto reader = cluster_.MakeClient(false);
  ASSERT_NE(reader, nullptr);
  auto got = reader->Get("after-remount");
  ASSERT_TRUE(got.ok()) << "the other client's object is lost: " << got.status().ToString();
  EXPECT_EQ(testdata::FirstDifference(*got, value), -1);
}

// The mount fence, same-host side (node/shm_segment.h, Renew). A client process copying a put
// into the node's shared memory passes the token check, copies half, and is paused (SIGSTOP);
// the master restarts, the node remounts, and another client puts an object into the same range.
// When the paused process resumes, the rest of its memcpy must not touch the new mount's objects:
// nothing can stop a paused process, so the remount gave the segment a new file and the late
// bytes land in the retired one.
TEST_F(FencingTest, SameHostWriterPausedMidCopyAcrossAMasterRestartCannotOverwriteTheNextPut) {
  ASSERT_TRUE(cluster_.Start(1, 8 * MiB));
  const std::string segment = cluster_.node(0).name();
  const uint64_t first_token = ListedToken(cluster_, segment);
  ASSERT_NE(first_token, 0u);
  constexpr uint64_t kSize = 1 * MiB;
  TempDir dir("granary-it-shm-pause");
  ChildProcess writer;
  std::string error;
  ASSERT_TRUE(writer.Start(BinaryPath("granary-test-worker"),
                           {"shm-put-paused", "--master", cluster_.master_address(), "--key",
                            "paused-shm", "--size", std::to_string(kSize)},
                           dir.File("writer.log"), &error))
      << error;
  ASSERT_TRUE(WaitForLog(writer, "copied half", Millis(10'000))) << writer.LogContents();
  ASSERT_TRUE(writer.WaitStopped(Millis(5000))) << "the writer did not pause itself";
  std::smatch m;
  const std::string said = writer.LogContents();
  ASSERT_TRUE(std::regex_search(said, m, std::regex("segment (\\S+) offset (\\d+)"))) << said;
  ASSERT_EQ(m[1].str(), segment);
  const uint64_t offset = std::stoull(m[2].str());

  ASSERT_TRUE(cluster_.RestartMaster());
  ASSERT_NE(WaitForRemount(cluster_, segment, first_token), 0u)
      << "the node did not remount after the master restarted";

  auto other = cluster_.MakeClient(true, TwoCallPuts());
  ASSERT_NE(other, nullptr);
  const Bytes value = testdata::Pattern("shm-put-after-remount", kSize);
  ReplicaInfo where;
  ASSERT_TRUE(PutAfterRemount(*other, "after-remount", value, &where));
  ASSERT_EQ(where.segment_name, segment);
  ASSERT_EQ(where.offset, offset) << "not the paused copy's range: the test would prove nothing";

  ASSERT_TRUE(writer.Kill(SIGCONT));  // the paused process finishes its memcpy
  auto exited = writer.Wait(Millis(10'000));
  ASSERT_TRUE(exited.has_value() && exited->Succeeded()) << writer.LogContents();
  EXPECT_NE(writer.LogContents().find("remounted during the write"), std::string::npos)
      << writer.LogContents();

  for (bool shm : {true, false}) {
    auto reader = cluster_.MakeClient(shm);
    ASSERT_NE(reader, nullptr);
    auto got = reader->Get("after-remount");
    ASSERT_TRUE(got.ok()) << "the other client's object is lost (" << (shm ? "shm" : "tcp")
                          << "): " << got.status().ToString();
    EXPECT_EQ(testdata::FirstDifference(*got, value), -1);
  }
}

// A long-lived client keeps no mapping of a segment that is gone: once the master no longer lists
// a dead node, the client's next refresh unmaps it (its memory is no longer charged to us).
TEST_F(FencingTest, ClientUnmapsTheSegmentOfANodeThatIsGone) {
  ASSERT_TRUE(cluster_.Start(2, 16 * MiB));
  auto client = cluster_.MakeClient(true);
  ASSERT_NE(client, nullptr);
  const Bytes value = testdata::Pattern("mapped", 256 * KiB);
  ReplicateConfig two;
  two.replica_num = 2;
  ASSERT_TRUE(client->Put("mapped", ByteSpan(value), two).ok());
  auto got = client->Get("mapped");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(client->Stats().shm_mappings, 2u) << "both nodes' segments should be mapped";
  const std::string gone = cluster_.node(1).name();

  cluster_.KillNode(1);
  ASSERT_TRUE(cluster_.WaitForSegments(
      [&](const auto& names) { return std::count(names.begin(), names.end(), gone) == 0; },
      Millis(8000)))
      << "the killed node was not expired";
  // The client keeps reading (the surviving replica); within the directory's maximum age plus
  // slack, the dead segment's mapping is dropped.
  bool dropped = WaitUntil(
      [&] {
        auto again = client->Get("mapped");
        if (!again.ok()) ADD_FAILURE() << again.status().ToString();
        return client->Stats().shm_mappings == 1;
      },
      Millis(15'000), Millis(200));
  EXPECT_TRUE(dropped) << "still " << client->Stats().shm_mappings << " mappings";
  EXPECT_EQ(ReadFile("/proc/self/maps").find(cluster_.node(1).ShmPath()), std::string::npos)
      << "the dead node's segment is still mapped";
}

// The master's read lease covers a copy only for lease_ttl_ms. A node stalls (SIGSTOP) in the
// middle of a TCP get for longer than that; meanwhile the master, the lease over, lets the object
// be removed (its space may be reused). When the node resumes and the bytes arrive, the get must
// not report them as a success.
TEST_F(FencingTest, GetWhoseLeaseExpiredMidCopyIsNotASuccess) {
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB, {{"--lease-ttl", "300ms"}, {"--client-ttl", "5s"}}));
  auto reader = cluster_.MakeClient(false);
  auto other = cluster_.MakeClient(false);
  ASSERT_TRUE(reader && other);
  const Bytes value = testdata::Pattern("leased", 8 * MiB);
  ASSERT_TRUE(other->Put("leased", ByteSpan(value)).ok());
  // A get within its lease works (retried once if this busy machine made it slow).
  auto warm = reader->Get("leased");
  ASSERT_TRUE(warm.ok()) << warm.status().ToString();

  NodeProcess& node = cluster_.node(0);
  ASSERT_TRUE(node.Kill(SIGSTOP));
  ASSERT_TRUE(node.process().WaitStopped(Millis(2000)));  // else the get could beat the stop
  Result<Bytes> result = Status(ErrorCode::INTERNAL_ERROR, "not run");
  std::thread get([&] { result = reader->Get("leased"); });
  std::this_thread::sleep_for(Millis(1000));  // the lease (300 ms) is over
  Status removed = other->Remove("leased");
  ASSERT_TRUE(node.Kill(SIGCONT));
  get.join();  // bounded by the client's I/O timeout (10 s)
  ASSERT_TRUE(removed.ok()) << "the master kept the object past its lease: " << removed.ToString();
  EXPECT_FALSE(result.ok()) << "a get returned bytes read after its lease expired (the object "
                               "had been removed meanwhile)";
  if (!result.ok()) {
    EXPECT_TRUE(result.code() == ErrorCode::LEASE_EXPIRED ||
                result.code() == ErrorCode::OBJECT_NOT_FOUND)
        << result.status().ToString();
  }
}

// A granary-node with a default (pid-based) name; returns its segment name from the ready line.
struct DefaultNode {
  ChildProcess process;
  std::string segment;
  std::string ShmPath() const { return "/dev/shm/granary-" + segment; }
};

::testing::AssertionResult StartDefaultNode(DefaultNode& node, const std::string& master,
                                            const std::string& log) {
  std::string error;
  if (!node.process.Start(BinaryPath("granary-node"),
                          {"--master", master, "--segment-size", "8MiB", "--host", "127.0.0.1",
                           "--port", "0", "--heartbeat-interval", "200ms", "--prefault=false",
                           "--reclaim-interval", "500ms"},
                          log, &error)) {
    return ::testing::AssertionFailure() << error;
  }
  if (!WaitForLog(node.process, "granary-node ready", Millis(10'000))) {
    return ::testing::AssertionFailure() << "no ready line:\n" << node.process.LogContents();
  }
  std::smatch m;
  const std::string text = node.process.LogContents();
  if (!std::regex_search(text, m, std::regex("granary-node ready: segment ([A-Za-z0-9._-]+),"))) {
    return ::testing::AssertionFailure() << "no segment name in:\n" << text;
  }
  node.segment = m[1];
  return ::testing::AssertionSuccess();
}

// Default names carry the pid, so nobody restarts under a dead node's name: its /dev/shm file
// would stay forever. Live nodes rescan and reclaim files whose owner is gone (lock free), and
// never the file of a node that is merely stopped.
TEST_F(FencingTest, SharedMemoryOfANodeKilledWithMinus9IsReclaimed) {
  ASSERT_TRUE(cluster_.Start(0, 0));
  TempDir dir("granary-it-reclaim");
  DefaultNode survivor, victim, stopped;
  ASSERT_TRUE(StartDefaultNode(survivor, cluster_.master_address(), dir.File("survivor.log")));
  ASSERT_TRUE(StartDefaultNode(victim, cluster_.master_address(), dir.File("victim.log")));
  ASSERT_TRUE(StartDefaultNode(stopped, cluster_.master_address(), dir.File("stopped.log")));
  EXPECT_NE(victim.segment, survivor.segment);
  ASSERT_TRUE(FileExists(victim.ShmPath()));
  ASSERT_TRUE(FileExists(stopped.ShmPath()));

  ASSERT_TRUE(stopped.process.Kill(SIGSTOP));
  victim.process.KillAndReap();
  // Orphans are judged after 5 s of age; the survivor looks every 500 ms.
  bool reclaimed = WaitUntil([&] { return !FileExists(victim.ShmPath()); }, Millis(20'000),
                             Millis(100));
  EXPECT_TRUE(reclaimed) << victim.ShmPath() << " of the killed node is still there\n"
                         << survivor.process.LogContents();
  // A few more scans: the stopped node's file is untouched.
  std::this_thread::sleep_for(Millis(1500));
  EXPECT_TRUE(FileExists(stopped.ShmPath())) << "a stopped (live) node's segment was removed";
  EXPECT_TRUE(FileExists(survivor.ShmPath()));
  ASSERT_TRUE(stopped.process.Kill(SIGCONT));
  // Clean shutdowns unlink their own files.
  for (DefaultNode* n : {&stopped, &survivor}) {
    n->process.Kill(SIGTERM);
    auto exited = n->process.Wait(Millis(10'000));
    EXPECT_TRUE(exited.has_value());
    EXPECT_FALSE(FileExists(n->ShmPath()));
  }
}

// Two containers on one host, same hostname, each with its own pid namespace and /dev/shm: both
// nodes run as pid 1 with default names. Neither may take over the other's segment (before, both
// were "<hostname>-1" with one host id, and the second mount took the first's over as if it had
// restarted). Needs unshare(1) with CAP_SYS_ADMIN; skipped otherwise.
TEST_F(FencingTest, SamePidNodesInTwoContainersDoNotTakeOverEachOther) {
  TempDir dir("granary-it-ns");
  std::string error;
  auto probe = RunCommand("/usr/bin/unshare", {"--pid", "--fork", "--ipc", "--mount", "true"},
                          dir.File("probe.log"), Millis(10'000), &error);
  if (!probe || !probe->Succeeded()) GTEST_SKIP() << "no pid/ipc/mount namespaces here: " << error;
  ASSERT_TRUE(cluster_.Start(0, 0));
  const std::string node_cmd =
      "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec " + BinaryPath("granary-node") +
      " --master " + cluster_.master_address() +
      " --segment-size 8MiB --host 127.0.0.1 --port 0 --heartbeat-interval 200ms"
      " --prefault=false";
  ChildProcess a, b;
  std::string names[2];
  int i = 0;
  for (ChildProcess* c : {&a, &b}) {
    ASSERT_TRUE(c->Start("/usr/bin/unshare",
                         {"--pid", "--kill-child", "--ipc", "--mount", "--mount-proc", "sh", "-c",
                          node_cmd},
                         dir.File("node" + std::to_string(i) + ".log"), &error))
        << error;
    ASSERT_TRUE(WaitForLog(*c, "granary-node ready", Millis(10'000))) << c->LogContents();
    std::smatch m;
    const std::string text = c->LogContents();
    ASSERT_TRUE(std::regex_search(text, m, std::regex("ready: segment ([A-Za-z0-9._-]+),")))
        << text;
    names[i++] = m[1];
  }
  // Both really are pid 1 of their namespace: the pid part of their default names is the same.
  for (const std::string& name : names) {
    EXPECT_TRUE(std::regex_search(name, std::regex("-1(-|$)"))) << name << " is not pid 1's";
  }
  EXPECT_NE(names[0], names[1]) << "two nodes picked the same default name";
  // Both stay mounted through several heartbeats: nobody took the other over.
  auto both = [&](const std::vector<std::string>& listed) {
    return std::count(listed.begin(), listed.end(), names[0]) == 1 &&
           std::count(listed.begin(), listed.end(), names[1]) == 1;
  };
  ASSERT_TRUE(cluster_.WaitForSegments(both, Millis(5000)));
  std::this_thread::sleep_for(Millis(1500));
  auto listed = cluster_.ListSegmentNames();
  ASSERT_TRUE(listed.has_value());
  EXPECT_TRUE(both(*listed)) << "listed: " << ::testing::PrintToString(*listed) << "\n"
                             << a.LogContents() << "\n" << b.LogContents();
  EXPECT_EQ(listed->size(), 2u);
}

}  // namespace
}  // namespace granary::it
