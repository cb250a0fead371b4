// Integration tests of roles and tenants (docs/security.md) with real processes: a master with
// the cluster's secret, an admin secret and a tenants file; a node with the cluster's secret;
// clients presenting each. Two tenants and the default namespace use the same keys and never see
// each other's objects (put, get, exist, size, stat, prefix match, regex list and remove,
// remove-all); a tenant over its quota is refused while the others keep putting; calls beyond a
// role are PERMISSION_DENIED and apply nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "granary/client.h"
#include "master_fixture.h"
#include "process_harness.h"
#include "security_helpers.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

constexpr const char* kCluster = "cluster-secret-0123456789abcdef";
constexpr const char* kAdmin = "admin-secret-0123456789abcdef00";
constexpr const char* kAcme = "acme-token-0123456789abcdef0000";
constexpr const char* kGlobex = "globex-token-0123456789abcdef00";

ByteSpan Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string Text(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_file_ = SecretFile(dir_, "cluster", kCluster);
    admin_file_ = SecretFile(dir_, "admin", kAdmin);
    acme_file_ = SecretFile(dir_, "acme", kAcme);
    globex_file_ = SecretFile(dir_, "globex", kGlobex);
    const std::string tenants = SecretFile(dir_, "tenants",
                                           std::string("# name token quota\n") +
                                               "acme " + kAcme + " 1MiB\n" +
                                               "globex " + kGlobex + "\n");
    ASSERT_TRUE(master_.Start({"--auth-token-file", cluster_file_, "--admin-token-file",
                               admin_file_, "--tenants-file", tenants}));
    ASSERT_TRUE(node_.Start(master_.address(), {"--auth-token-file", cluster_file_}));
  }

  std::unique_ptr<Client> ClientWith(const std::string& file, bool fast = true,
                                     uint64_t reserve = 0) {
    ClientOptions o;
    o.master_address = master_.address();
    o.auth_token_file = file;
    o.rpc_timeout_ms = 5000;
    o.use_fast_path = fast;
    o.reserve_bytes = reserve;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  TempDir dir_{"granary-tenants"};
  MasterProcess master_;
  NodeProcess node_{UniqueName("tenant-node"), 64 * MiB, dir_.path()};
  std::string cluster_file_, admin_file_, acme_file_, globex_file_;
};

TEST_F(TenantsTest, TenantsAndTheDefaultNamespaceKeepTheSameKeysApart) {
  for (bool fast : {true, false}) {  // the fast port and gRPC
    SCOPED_TRACE(fast ? "fast port" : "gRPC");
    auto member = ClientWith(cluster_file_, fast);
    auto acme = ClientWith(acme_file_, fast);
    auto globex = ClientWith(globex_file_, fast);
    ASSERT_TRUE(member && acme && globex);
    struct Who {
      Client* client;
      std::string value;
    };
    const std::vector<Who> all = {{member.get(), "default's bytes"},
                                  {acme.get(), "acme's bytes, longer"},
                                  {globex.get(), "globex"}};
    for (const Who& w : all) {
      ASSERT_TRUE(w.client->Put("shared/key", Bytes(w.value)).ok());
      ASSERT_TRUE(w.client->Put("shared/" + w.value.substr(0, 4), Bytes(w.value)).ok());
    }
    for (const Who& w : all) {
      auto got = w.client->Get("shared/key");
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(Text(*got), w.value);
      auto size = w.client->GetSize("shared/key");
      ASSERT_TRUE(size.ok());
      EXPECT_EQ(*size, w.value.size());
      auto stat = w.client->Stat("shared/key");
      ASSERT_TRUE(stat.ok());
      EXPECT_EQ(stat->size, w.value.size());
      // Each lists its own two keys, as it wrote them; never another's.
      auto listed = w.client->QueryByRegex("^shared/");
      ASSERT_TRUE(listed.ok());
      std::vector<std::string> keys;
      for (const auto& o : *listed) keys.push_back(o.key);
      std::sort(keys.begin(), keys.end());
      EXPECT_EQ(keys, (std::vector<std::string>{"shared/" + w.value.substr(0, 4), "shared/key"}));
      auto matched = w.client->PrefixMatch({"shared/key", "shared/" + w.value.substr(0, 4)});
      ASSERT_TRUE(matched.ok());
      EXPECT_EQ(*matched, 2u);
    }
    // A key only acme has: nobody else finds it by any call.
    ASSERT_TRUE(acme->Put("acme-only", Bytes(std::string("a"))).ok());
    for (Client* other : {member.get(), globex.get()}) {
      EXPECT_EQ(other->Get("acme-only").status().code(), ErrorCode::OBJECT_NOT_FOUND);
      auto exists = other->Exist("acme-only");
      ASSERT_TRUE(exists.ok());
      EXPECT_FALSE(*exists);
      EXPECT_EQ(other->Stat("acme-only").status().code(), ErrorCode::OBJECT_NOT_FOUND);
      EXPECT_EQ(other->Remove("acme-only").code(), ErrorCode::OBJECT_NOT_FOUND);
      auto removed = other->RemoveByRegex("acme-only");
      ASSERT_TRUE(removed.ok());
      EXPECT_EQ(*removed, 0u);
    }
    // A key spelled as the master holds a tenant's is an invalid key to every caller.
    const std::string forged = std::string(1, '\0') + "acme" + std::string(1, '\0') + "acme-only";
    for (Client* c : {member.get(), globex.get(), acme.get()}) {
      EXPECT_EQ(c->Put(forged, Bytes(std::string("x"))).code(), ErrorCode::INVALID_KEY);
      EXPECT_EQ(c->Get(forged).status().code(), ErrorCode::INVALID_KEY);
      EXPECT_NE(c->Remove(forged).code(), ErrorCode::OK);
      auto exists = c->Exist(forged);
      EXPECT_FALSE(exists.ok() && *exists);
    }
    ASSERT_TRUE(acme->Get("acme-only").ok());

    // A tenant's remove-all and regex removal reach its own keys only.
    auto removed = globex->RemoveByRegex("^shared/");
    ASSERT_TRUE(removed.ok());
    EXPECT_EQ(*removed, 2u);
    removed = acme->RemoveAll();
    ASSERT_TRUE(removed.ok());
    EXPECT_EQ(*removed, 3u);
    auto kept = member->Get("shared/key");
    ASSERT_TRUE(kept.ok());
    EXPECT_EQ(Text(*kept), "default's bytes");
    // The member's remove-all (an admin secret exists) empties the default namespace only.
    ASSERT_TRUE(acme->Put("survivor", Bytes(std::string("acme survives"))).ok());
    removed = member->RemoveAll();
    ASSERT_TRUE(removed.ok());
    EXPECT_EQ(*removed, 2u);
    ASSERT_TRUE(acme->Get("survivor").ok());
    ASSERT_TRUE(acme->Remove("survivor").ok());
  }
}

TEST_F(TenantsTest, ATenantOverItsQuotaIsRefusedAndOthersKeepPutting) {
  for (uint64_t reserve : {uint64_t{0}, uint64_t{4} * MiB}) {  // two-call puts, reserved space
    SCOPED_TRACE(reserve ? "reserved space" : "two-call puts");
    auto acme = ClientWith(acme_file_, true, reserve);
    auto globex = ClientWith(globex_file_, true, reserve);
    ASSERT_TRUE(acme && globex);
    const std::string value(200 * KiB, 'q');
    int stored = 0;
    Status refused;
    for (int i = 0; i < 10; ++i) {  // 1 MiB holds five
      Status s = acme->Put("obj" + std::to_string(i), Bytes(value));
      if (s.ok()) {
        stored++;
      } else {
        refused = s;
      }
    }
    EXPECT_EQ(stored, 5);
    EXPECT_EQ(refused.code(), ErrorCode::QUOTA_EXCEEDED) << refused.ToString();
    EXPECT_NE(refused.message().find("acme"), std::string::npos) << refused.ToString();
    // Others are not affected: globex has no quota, the default namespace none either.
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(globex->Put("obj" + std::to_string(i), Bytes(value)).ok());
    }
    // Every object acme was told it stored is there, exact.
    for (int i = 0; i < stored; ++i) {
      auto got = acme->Get("obj" + std::to_string(i));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(Text(*got), value);
    }
    // Room again after a removal.
    ASSERT_TRUE(acme->Remove("obj0").ok());
    EXPECT_TRUE(acme->Put("again", Bytes(value)).ok());

    auto cluster = acme->Cluster();
    ASSERT_TRUE(cluster.ok());
    EXPECT_EQ(cluster->caller_role, "tenant");
    EXPECT_EQ(cluster->caller_tenant, "acme");
    EXPECT_EQ(cluster->leader_http_port, master_.http_port()) << "where granary top reads /metrics";
    ASSERT_EQ(cluster->tenants.size(), 1u);  // a tenant sees itself only
    EXPECT_EQ(cluster->tenants[0].name, "acme");
    EXPECT_EQ(cluster->tenants[0].objects, 5u);
    EXPECT_EQ(cluster->tenants[0].bytes, 5 * value.size());
    EXPECT_EQ(cluster->tenants[0].quota_bytes, MiB);

    const HttpResult metrics = HttpGet(master_.http_port(), "/metrics");
    EXPECT_EQ(MetricValue(metrics.body, "granary_master_tenant_bytes", "tenant=\"acme\""),
              static_cast<double>(5 * value.size()));
    EXPECT_EQ(MetricValue(metrics.body, "granary_master_tenant_objects", "tenant=\"globex\""),
              10);
    EXPECT_EQ(MetricValue(metrics.body, "granary_master_tenant_quota_bytes", "tenant=\"acme\""),
              static_cast<double>(MiB));
    EXPECT_GE(MetricValue(metrics.body, "granary_master_tenant_quota_refusals_total",
                          "tenant=\"acme\""),
              5);
    // acme read its objects back (a series per tenant and outcome, 0 until it moves).
    EXPECT_GE(MetricValue(metrics.body, "granary_master_tenant_gets_total",
                          "tenant=\"acme\",outcome=\"memory_hit\""),
              stored);
    EXPECT_GE(MetricValue(metrics.body, "granary_master_tenant_gets_total",
                          "tenant=\"globex\",outcome=\"miss\""),
              0);
    auto admin = ClientWith(admin_file_);
    ASSERT_TRUE(admin);
    ASSERT_TRUE(admin->RemoveAll().ok());  // the admin's reaches every tenant
    cluster = admin->Cluster();
    ASSERT_TRUE(cluster.ok());
    EXPECT_EQ(cluster->caller_role, "admin");
    ASSERT_EQ(cluster->tenants.size(), 2u);
    for (const auto& t : cluster->tenants) {
      EXPECT_EQ(t.objects, 0u) << t.name;
      EXPECT_EQ(t.bytes, 0u) << t.name;
    }
  }
}

TEST_F(TenantsTest, ConcurrentPutsOfOneTenantCannotPassItsQuotaTogether) {
  // Four clients of acme (1 MiB) put 200 KiB objects at once: five fit, whoever wins them.
  std::vector<std::unique_ptr<Client>> clients;
  for (int c = 0; c < 4; ++c) {
    clients.push_back(ClientWith(acme_file_, true, c % 2 ? 4 * MiB : 0));  // reserved or not
  }
  for (const auto& c : clients) ASSERT_TRUE(c);
  const std::string value(200 * KiB, 'c');
  std::atomic<int> stored{0}, over{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < 4; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < 6; ++i) {
        const std::string key = "c" + std::to_string(c) + "-" + std::to_string(i);
        Status s = clients[c]->Put(key, Bytes(value));
        if (s.ok()) stored++;
        if (s.code() == ErrorCode::QUOTA_EXCEEDED) over++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(stored.load(), 5);
  EXPECT_EQ(over.load(), 19);
  auto cluster = clients[0]->Cluster();
  ASSERT_TRUE(cluster.ok());
  ASSERT_EQ(cluster->tenants.size(), 1u);
  EXPECT_EQ(cluster->tenants[0].bytes, 5 * value.size());
}

TEST_F(TenantsTest, CallsBeyondARoleAreDeniedAndApplyNothing) {
  auto member = ClientWith(cluster_file_);
  auto acme = ClientWith(acme_file_);
  auto admin = ClientWith(admin_file_);
  ASSERT_TRUE(member && acme && admin);
  ASSERT_TRUE(member->Put("held", Bytes(std::string("member's"))).ok());
  ASSERT_TRUE(acme->Put("held", Bytes(std::string("acme's"))).ok());

  // Forced removal is the admin's: a tenant's and a member's are refused whole.
  for (Client* c : {acme.get(), member.get()}) {
    EXPECT_EQ(c->Remove("held", /*force=*/true).code(), ErrorCode::PERMISSION_DENIED);
    EXPECT_EQ(c->RemoveAll(/*force=*/true).status().code(), ErrorCode::PERMISSION_DENIED);
    EXPECT_EQ(c->RemoveByRegex(".", /*force=*/true).status().code(),
              ErrorCode::PERMISSION_DENIED);
  }
  ASSERT_TRUE(member->Get("held").ok());
  ASSERT_TRUE(acme->Get("held").ok());

  // A tenant contributes no segment: its embedded node is refused at the mount.
  {
    ClientOptions o;
    o.master_address = master_.address();
    o.auth_token_file = acme_file_;
    o.segment_size = 16 * MiB;
    auto c = Client::Connect(o);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), ErrorCode::PERMISSION_DENIED) << c.status().ToString();
  }
  // Nor may it mount over gRPC directly, or ping as a node (with its mounts).
  const grpc::Status mount = MountSegmentAs(master_.address(), kAcme, "acme-segment");
  EXPECT_EQ(mount.error_code(), grpc::StatusCode::PERMISSION_DENIED) << mount.error_message();
  EXPECT_EQ(rpc::FromGrpc(mount, "mount").code(), ErrorCode::PERMISSION_DENIED);
  {
    auto stub = StubWith(master_.address(), kAcme);
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, 5000);
    pb::PingRequest ping;
    ping.set_client_id("acme-node");
    ping.add_mounts()->set_name("acme-segment");
    pb::PingResponse pong;
    EXPECT_EQ(stub->Ping(&ctx, ping, &pong).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  auto segments = admin->ListSegments();
  ASSERT_TRUE(segments.ok());
  EXPECT_EQ(segments->size(), 1u) << "only the node's segment is mounted";

  // A tenant may not stream the history (every tenant's keys): refused on the fast port.
  pb::ListSegmentsResponse listed;
  auto stub = StubWith(master_.address(), kCluster);
  ASSERT_TRUE(ListSegments(stub.get(), &listed).ok());
  int fd = ConnectFast(static_cast<uint16_t>(listed.fast_port()));
  ASSERT_GE(fd, 0);
  FastReply r = Exchange(fd, fast::Method::kHello, kAcme);
  ASSERT_TRUE(r.transport.ok());
  ASSERT_FALSE(r.header.flags & fast::kError) << r.body;
  r = Exchange(fd, fast::Method::kReplicate, "");
  ASSERT_TRUE(r.transport.ok());
  EXPECT_TRUE(r.header.flags & fast::kError);
  auto coded = rpc::ParseCodedMessage(r.body);
  ASSERT_TRUE(coded.has_value()) << r.body;
  EXPECT_EQ(coded->code(), ErrorCode::PERMISSION_DENIED);
  ::close(fd);

  // The admin may do what the others may not.
  auto removed = admin->RemoveByRegex("^held$", /*force=*/true);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, 2u);  // the member's and acme's
  EXPECT_EQ(acme->Get("held").status().code(), ErrorCode::OBJECT_NOT_FOUND);

  auto who = member->Cluster();
  ASSERT_TRUE(who.ok());
  EXPECT_EQ(who->caller_role, "member");
  EXPECT_EQ(who->caller_tenant, "");
  EXPECT_EQ(who->tenants.size(), 2u);
  EXPECT_EQ(master_.Log().find(kAcme), std::string::npos);
  EXPECT_EQ(master_.Log().find(kAdmin), std::string::npos);
}

TEST_F(TenantsTest, ATenantsClientIdsAndSegmentViewAreItsOwn) {
  // A member's client reserves space; a tenant naming that client id cannot release it.
  auto member = StubWith(master_.address(), kCluster);
  auto tenant = StubWith(master_.address(), kAcme);
  pb::ReserveRequest reserve;
  reserve.set_client_id("victim-client");
  reserve.set_size(4096);
  reserve.set_count(1);
  pb::ReserveResponse granted;
  {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, 5000);
    ASSERT_TRUE(member->Reserve(&ctx, reserve, &granted).ok());
  }
  ASSERT_EQ(granted.granted_size(), 1) << granted.message();
  pb::ReleaseReservationsRequest release;
  release.set_client_id("victim-client");
  release.add_reservations(granted.granted(0).reservation());
  release.add_segment_ids(granted.granted(0).replica().segment_id());
  release.add_offsets(granted.granted(0).replica().offset());
  for (auto* stub : {tenant.get(), member.get()}) {
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, 5000);
    pb::BatchStatusResponse released;
    ASSERT_TRUE(stub->ReleaseReservations(&ctx, release, &released).ok());
    ASSERT_EQ(released.results_size(), 1);
    if (stub == tenant.get()) {
      EXPECT_NE(released.results(0).code(), 0) << "a tenant released a member's reservation";
    } else {
      EXPECT_EQ(released.results(0).code(), 0) << "the reservation was no longer held";
    }
  }
  // Reserved space counts against the quota across the tenant's clients: acme's 1 MiB holds
  // four 256 KiB reservations in all, however many client ids ask.
  uint32_t reserved = 0;
  for (const char* id : {"acme-1", "acme-2", "acme-3"}) {
    pb::ReserveRequest ask;
    ask.set_client_id(id);
    ask.set_size(256 * KiB);
    ask.set_count(3);
    pb::ReserveResponse got;
    grpc::ClientContext ctx;
    rpc::SetDeadline(ctx, 5000);
    ASSERT_TRUE(tenant->Reserve(&ctx, ask, &got).ok());
    reserved += static_cast<uint32_t>(got.granted_size());
    if (got.granted_size() == 0) {
      EXPECT_EQ(got.code(), static_cast<int32_t>(ErrorCode::QUOTA_EXCEEDED));
    }
  }
  EXPECT_EQ(reserved, 4u);
    // A tenant is told no segment's shared-memory name, host or token; a member is.
  for (auto* stub : {tenant.get(), member.get()}) {
    pb::ListSegmentsResponse listed;
    ASSERT_TRUE(ListSegments(stub, &listed).ok());
    ASSERT_EQ(listed.segments_size(), 1);
    const bool told = listed.segments(0).token() != 0 || !listed.segments(0).shm_name().empty();
    EXPECT_EQ(told, stub == member.get());
    EXPECT_NE(listed.fast_port(), 0u);
  }
}

TEST(TenantsDiskTest, ATenantsObjectOnlyOnDiskIsReadByItsTenantOnly) {
  TempDir dir("granary-tenants-disk");
  TempDir disk("granary-tenants-disk-tier");
  const std::string cluster = SecretFile(dir, "cluster", kCluster);
  const std::string acme_file = SecretFile(dir, "acme", kAcme);
  const std::string globex_file = SecretFile(dir, "globex", kGlobex);
  const std::string tenants = SecretFile(
      dir, "tenants", std::string("acme ") + kAcme + "\nglobex " + kGlobex + "\n");
  MasterProcess master;
  ASSERT_TRUE(master.Start({"--auth-token-file", cluster, "--tenants-file", tenants,
                            "--persistence", "eager", "--client-ttl", "10s"}));
  NodeProcess node(UniqueName("tenant-disk"), 64 * MiB, dir.path());
  ASSERT_TRUE(node.Start(master.address(), {"--auth-token-file", cluster, "--disk-dir",
                                            disk.path(), "--disk-size", "256MiB"}));
  auto connect = [&](const std::string& file) { return ConnectClient(master.address(), file); };
  auto acme = connect(acme_file);
  auto globex = connect(globex_file);
  ASSERT_TRUE(acme && globex);
  const std::string value(300 * KiB + 5, 'd');
  ASSERT_TRUE(acme->Put("on-disk", Bytes(value)).ok());
  auto on_disk = [&] {
    auto st = acme->Stat("on-disk");
    return st.ok() && !st->disk_replicas.empty();
  };
  ASSERT_TRUE(WaitUntil(on_disk, Millis(15'000), Millis(100))) << node.AllLogs();
  // A restarted master knows the object from the node's disk only.
  ASSERT_TRUE(master.Restart());
  ASSERT_TRUE(WaitUntil(on_disk, Millis(15'000), Millis(100))) << node.AllLogs();
  auto st = acme->Stat("on-disk");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(st->replicas.empty()) << "in memory after a master restart";
  auto got = acme->Get("on-disk");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(Text(*got), value);
  EXPECT_EQ(globex->Get("on-disk").status().code(), ErrorCode::OBJECT_NOT_FOUND);
}

TEST(TenantsConfigTest, BadTenantsFilesAndLoneRoleSecretsStopTheMaster) {
  TempDir dir("granary-tenants-config");
  const std::string cluster = SecretFile(dir, "cluster", kCluster);
  const std::string admin = SecretFile(dir, "admin", kAdmin);
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  const std::string reused = SecretFile(dir, "reused", std::string("acme ") + kCluster + "\n");
  const std::string short_token = SecretFile(dir, "short", "acme short\n");
  const std::string bad_quota = SecretFile(dir, "quota", std::string("acme ") + kAcme + " lots\n");
  const std::string readable = dir.WriteFile("readable", std::string("acme ") + kAcme + "\n");
  ASSERT_EQ(::chmod(readable.c_str(), 0644), 0);
  const std::vector<Case> cases = {
      {{"--admin-token-file", admin}, "need --auth-token-file"},
      {{"--auth-token-file", cluster, "--tenants-file", reused}, "must all differ"},
      {{"--auth-token-file", cluster, "--admin-token-file", cluster}, "must all differ"},
      {{"--auth-token-file", cluster, "--tenants-file", short_token}, "line 1"},
      {{"--auth-token-file", cluster, "--tenants-file", bad_quota}, "line 1"},
      {{"--auth-token-file", cluster, "--tenants-file", readable}, "chmod 600"},
  };
  for (const Case& c : cases) {
    MasterProcess master;
    EXPECT_FALSE(master.Start(c.flags)) << c.says;
    EXPECT_NE(master.Log().find(c.says), std::string::npos) << master.Log();
    EXPECT_EQ(master.Log().find(kCluster), std::string::npos);
  }
}

}  // namespace
}  // namespace granary::it
