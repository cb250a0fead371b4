// Integration tests of data-plane capabilities (docs/security.md, "Capabilities") with real
// processes: a master with the cluster's secret and a tenants file, a node with the secret. Put
// and get answers carry a capability for each replica's own range (write for puts, read for
// gets) that ends with the put or the read lock, and the node refuses it anywhere else, for
// anything else, or later. A tenant is never told a segment's token; a member is (it names the
// mount in same-host shared memory), but the node with a secret serves no range for a token.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "granary/client.h"
#include "master_fixture.h"
#include "process_harness.h"
#include "security_helpers.h"
#include "store_fixture.h"
#include "transfer/tcp_transport.h"

namespace granary::it {
namespace {

constexpr const char* kCluster = "cluster-secret-0123456789abcdef";
constexpr const char* kAcme = "acme-token-0123456789abcdef0000";

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ByteSpan Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

pb::GetReplicaResult GetReplicas(pb::Master::Stub* stub, const std::string& client,
                                 const std::string& key) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, 5000);
  pb::BatchGetReplicaListRequest req;
  req.set_client_id(client);
  req.add_keys(key);
  pb::BatchGetReplicaListResponse resp;
  const grpc::Status s = stub->BatchGetReplicaList(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.results_size() == 1 ? resp.results(0) : pb::GetReplicaResult();
}

transfer::Capability WireOf(const pb::Capability& c) {
  transfer::Capability cap;
  cap.grant_offset = c.grant_offset();
  cap.grant_length = c.grant_length();
  cap.expiry_unix_ms = c.expiry_unix_ms();
  cap.access = c.access();
  EXPECT_EQ(c.mac().size(), sizeof(cap.mac));
  std::memcpy(cap.mac, c.mac().data(), std::min(c.mac().size(), sizeof(cap.mac)));
  return cap;
}

class CapabilitiesTest : public ::testing::Test {
 protected:
  void StartStore(std::vector<std::string> master_flags = {}) {
    cluster_file_ = SecretFile(dir_, "cluster", kCluster);
    acme_file_ = SecretFile(dir_, "acme", kAcme);
    const std::string tenants = SecretFile(dir_, "tenants", std::string("acme ") + kAcme + "\n");
    std::vector<std::string> flags = {"--auth-token-file", cluster_file_, "--tenants-file",
                                      tenants};
    flags.insert(flags.end(), master_flags.begin(), master_flags.end());
    ASSERT_TRUE(master_.Start(flags));
    ASSERT_TRUE(node_.Start(master_.address(), {"--auth-token-file", cluster_file_}));
  }

  TempDir dir_{"granary-caps"};
  MasterProcess master_;
  NodeProcess node_{UniqueName("cap-node"), 64 * MiB, dir_.path()};
  std::string cluster_file_, acme_file_;
};

TEST_F(CapabilitiesTest, ATenantReachesItsOwnReplicasOnlyAndNeverLearnsAToken) {
  StartStore({"--lease-ttl", "5s"});
  auto member = ConnectClient(master_.address(), cluster_file_);
  auto acme = ConnectClient(master_.address(), acme_file_);
  ASSERT_TRUE(member && acme);
  // Through the client library: a tenant's puts and gets go over capabilities.
  const std::string theirs(64 * KiB, 'D'), mine(96 * KiB, 'a');
  ASSERT_TRUE(member->Put("default-object", Bytes(theirs)).ok());
  ASSERT_TRUE(acme->Put("acme-object", Bytes(mine)).ok());
  auto got = acme->Get("acme-object");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size(), mine.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->data()), got->size()), mine);

  auto acme_stub = StubWith(master_.address(), kAcme);
  auto member_stub = StubWith(master_.address(), kCluster);
  // A member's get carries the token and a read capability; the token alone reads nothing.
  const pb::GetReplicaResult default_replicas =
      GetReplicas(member_stub.get(), "member-probe", "default-object");
  ASSERT_EQ(default_replicas.code(), 0);
  ASSERT_EQ(default_replicas.replicas_size(), 1);
  const pb::Replica& default_replica = default_replicas.replicas(0);
  EXPECT_NE(default_replica.token(), 0u);
  ASSERT_TRUE(default_replica.has_capability());
  EXPECT_EQ(default_replica.capability().access(), 1u);
  EXPECT_EQ(default_replica.capability().grant_offset(), default_replica.offset());
  {
    transfer::TcpTransport tcp;
    std::vector<std::byte> bytes(default_replica.length());
    transfer::RemoteRange by_token{default_replica.endpoint(), default_replica.token(),
                                   default_replica.offset(), default_replica.length()};
    EXPECT_EQ(tcp.Read(by_token, bytes).code(), ErrorCode::PERMISSION_DENIED);
    std::vector<std::byte> junk(default_replica.length(), std::byte{'X'});
    EXPECT_EQ(tcp.Write(by_token, junk).code(), ErrorCode::PERMISSION_DENIED);
    by_token.capability = WireOf(default_replica.capability());
    ASSERT_TRUE(tcp.Read(by_token, bytes).ok());
    EXPECT_EQ(std::memcmp(bytes.data(), theirs.data(), theirs.size()), 0);
  }

  // A tenant's get: no token, a read capability for exactly its replica, ending with the lease.
  const int64_t asked_at = NowUnixMs();
  const pb::GetReplicaResult acme_replicas = GetReplicas(acme_stub.get(), "probe", "acme-object");
  ASSERT_EQ(acme_replicas.code(), 0);
  ASSERT_EQ(acme_replicas.replicas_size(), 1);
  const pb::Replica& replica = acme_replicas.replicas(0);
  EXPECT_EQ(replica.token(), 0u);
  ASSERT_TRUE(replica.has_capability());
  const pb::Capability& cap = replica.capability();
  EXPECT_EQ(cap.access(), 1u);
  EXPECT_EQ(cap.grant_offset(), replica.offset());
  EXPECT_EQ(cap.grant_length(), replica.length());
  EXPECT_GE(cap.expiry_unix_ms(), asked_at + 4000);
  EXPECT_LE(cap.expiry_unix_ms(), NowUnixMs() + 5000) << "a capability outlasting its read lock";

  transfer::TcpTransport tcp;
  std::vector<std::byte> buf(replica.length());
  transfer::RemoteRange own{replica.endpoint(), 0, replica.offset(), replica.length(),
                            WireOf(cap)};
  ASSERT_TRUE(tcp.Read(own, buf).ok());
  EXPECT_EQ(std::memcmp(buf.data(), mine.data(), mine.size()), 0);
  // The same capability on the default namespace's object, or on the whole segment: refused.
  transfer::RemoteRange other{replica.endpoint(), 0, default_replica.offset(),
                              default_replica.length(), WireOf(cap)};
  std::vector<std::byte> stolen(default_replica.length());
  EXPECT_EQ(tcp.Read(other, stolen).code(), ErrorCode::PERMISSION_DENIED);
  EXPECT_EQ(std::count(stolen.begin(), stolen.end(), std::byte{'D'}), 0);
  // Turned into a write: refused, and the bytes stay.
  std::vector<std::byte> junk(replica.length(), std::byte{'X'});
  EXPECT_NE(tcp.Write(own, junk).code(), ErrorCode::OK);
  // Without a capability, the token a tenant holds (0) reads nothing.
  transfer::RemoteRange bare{replica.endpoint(), 0, default_replica.offset(),
                             default_replica.length()};
  EXPECT_EQ(tcp.Read(bare, stolen).code(), ErrorCode::PERMISSION_DENIED);
  auto again = member->Get("default-object");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(again->data()), again->size()), theirs);
  auto still = acme->Get("acme-object");
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(still->data()), still->size()), mine);

  // A tenant's put start: a write capability for its new replica; its stat: neither.
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, 5000);
    pb::BatchPutStartRequest req;
    req.set_client_id("probe");
    req.add_keys("acme-second");
    req.add_sizes(4096);
    pb::BatchPutStartResponse resp;
    ASSERT_TRUE(acme_stub->BatchPutStart(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.results_size(), 1);
    ASSERT_EQ(resp.results(0).code(), 0) << resp.results(0).message();
    ASSERT_EQ(resp.results(0).replicas_size(), 1);
    const pb::Replica& target = resp.results(0).replicas(0);
    EXPECT_EQ(target.token(), 0u);
    ASSERT_TRUE(target.has_capability());
    EXPECT_EQ(target.capability().access(), 2u);
    EXPECT_EQ(target.capability().grant_offset(), target.offset());
    EXPECT_EQ(target.capability().grant_length(), target.length());
    std::vector<std::byte> value(4096, std::byte{'s'});
    transfer::RemoteRange write{target.endpoint(), 0, target.offset(), target.length(),
                                WireOf(target.capability())};
    EXPECT_TRUE(tcp.Write(write, value).ok());
    write.offset = default_replica.offset();  // somebody else's bytes
    EXPECT_EQ(tcp.Write(write, value).code(), ErrorCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, 5000);
    pb::StatObjectRequest req;
    req.set_key("acme-object");
    pb::StatObjectResponse resp;
    ASSERT_TRUE(acme_stub->StatObject(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.code(), 0);
    ASSERT_GE(resp.replicas_size(), 1);
    EXPECT_EQ(resp.replicas(0).token(), 0u);
    EXPECT_FALSE(resp.replicas(0).has_capability());
  }
  again = member->Get("default-object");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(again->data()), again->size()), theirs)
      << "a tenant's refused write changed another's bytes";
}

TEST_F(CapabilitiesTest, ACapabilityEndsWithItsReadLock) {
  StartStore({"--lease-ttl", "1s"});
  auto acme = ConnectClient(master_.address(), acme_file_);
  ASSERT_TRUE(acme);
  const std::string value(8 * KiB, 'v');
  ASSERT_TRUE(acme->Put("k", Bytes(value)).ok());
  auto stub = StubWith(master_.address(), kAcme);
  const pb::GetReplicaResult r = GetReplicas(stub.get(), "probe", "k");
  ASSERT_EQ(r.replicas_size(), 1);
  const pb::Replica& replica = r.replicas(0);
  transfer::TcpTransport tcp;
  std::vector<std::byte> buf(replica.length());
  transfer::RemoteRange range{replica.endpoint(), 0, replica.offset(), replica.length(),
                              WireOf(replica.capability())};
  ASSERT_TRUE(tcp.Read(range, buf).ok());
  // Past the lease (the node's clock is this host's): refused; a new get reads again.
  const int64_t wait_ms = replica.capability().expiry_unix_ms() - NowUnixMs() + 50;
  ASSERT_LE(wait_ms, 1100);
  std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(wait_ms, 0)));
  EXPECT_EQ(tcp.Read(range, buf).code(), ErrorCode::SEGMENT_NOT_FOUND);
  auto got = acme->Get("k");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size(), value.size());
}

}  // namespace
}  // namespace granary::it
