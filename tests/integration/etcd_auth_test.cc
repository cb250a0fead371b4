// etcd with `auth enable` (docs/security.md, "etcd"): a real etcd whose root user has a
// password. The client authenticates with etcd's user and password, carries the token on every
// call, watch and keepalive, and takes a new one when etcd forgets it (a restarted etcd keeps no
// token); without the user, or with a wrong password, etcd refuses everything and the password
// shows in no message. HA masters, nodes and clients given the user's file run a cluster on
// such an etcd and fail over on it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "../tools/test_pattern.h"
#include "etcd/etcd_client.h"
#include "etcd_harness.h"
#include "ha_fixture.h"
#include "process_harness.h"

namespace granary::it {
namespace {

constexpr char kPassword[] = "s3cret-etcd-password";

// Turns etcd's auth on: a root user with kPassword (etcd needs root before `auth enable`).
::testing::AssertionResult EnableAuth(const std::string& endpoints) {
  std::string error;
  if (!Etcdctl(endpoints, {"user", "add", std::string("root:") + kPassword}, &error)) {
    return ::testing::AssertionFailure() << error;
  }
  if (!Etcdctl(endpoints, {"auth", "enable"}, &error)) {
    return ::testing::AssertionFailure() << error;
  }
  return ::testing::AssertionSuccess();
}

std::string UserFile(const TempDir& dir, const std::string& line) {
  const std::string path = dir.WriteFile("etcd-user", line + "\n");
  EXPECT_EQ(::chmod(path.c_str(), 0600), 0);
  return path;
}

class EtcdAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(etcd_.Start());
    ASSERT_TRUE(EnableAuth(etcd_.endpoint()));
  }
  std::unique_ptr<etcd::EtcdClient> Connect(const std::string& user, const std::string& password) {
    auto c = etcd::EtcdClient::Connect(etcd_.endpoint(), 3000, {user, password});
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  EtcdServer etcd_;
};

TEST_F(EtcdAuthTest, OnlyTheUsersPasswordOpensEtcd) {
  auto root = Connect("root", kPassword);
  ASSERT_NE(root, nullptr);
  ASSERT_TRUE(root->Put("/k", "v").ok());
  auto got = root->Get("/k");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, "v");

  auto anonymous = Connect("", "");
  ASSERT_NE(anonymous, nullptr);
  EXPECT_FALSE(anonymous->Get("/k").ok());
  EXPECT_FALSE(anonymous->Put("/k", "anonymous").ok());
  auto wrong = Connect("root", "not-the-password");
  ASSERT_NE(wrong, nullptr);
  auto refused = wrong->Put("/k", "wrong");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message().find("not-the-password"), std::string::npos);
  EXPECT_NE(refused.status().message().find("root"), std::string::npos)
      << refused.status().ToString();
  got = root->Get("/k");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, "v") << "the refused clients changed nothing";
}

TEST_F(EtcdAuthTest, LeasesAndWatchesCarryTheTokenAndOutliveARestartedEtcd) {
  auto root = Connect("root", kPassword);
  ASSERT_NE(root, nullptr);
  auto lease = root->GrantLease(5);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto keepalive = root->StartKeepAlive(lease->id);
  ASSERT_TRUE(keepalive.ok()) << keepalive.status().ToString();
  ASSERT_TRUE((*keepalive)->Renew().ok());
  std::mutex mu;
  std::vector<std::string> seen;
  auto watch = root->StartWatch(
      "/w/", true, 0,
      [&](const std::vector<etcd::WatchEvent>& events) {
        std::lock_guard lock(mu);
        for (const auto& e : events) seen.push_back(e.kv.value);
      },
      [](Status) {});
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();
  ASSERT_TRUE(root->Put("/w/1", "before").ok());

  // A restarted etcd keeps its users but no token: every kind of call authenticates again.
  ASSERT_TRUE(etcd_.Restart());
  Result<int64_t> put = Status(ErrorCode::RPC_FAIL, "not tried");
  for (int i = 0; i < 20 && !put.ok(); ++i) put = root->Put("/w/2", "after");  // bounded
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  Result<int64_t> renewed = Status(ErrorCode::RPC_FAIL, "not tried");
  for (int i = 0; i < 20 && !renewed.ok(); ++i) renewed = (*keepalive)->Renew();  // bounded
  EXPECT_TRUE(renewed.ok()) << renewed.status().ToString();
  EXPECT_TRUE(WaitUntil(
      [&] {
        std::lock_guard lock(mu);
        return seen.size() == 2;
      },
      Millis(10'000)));
  std::lock_guard lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"before", "after"}));
}

TEST(EtcdAuthFileTest, AFileOthersMayReadOrWithoutAColonIsRefused) {
  TempDir dir;
  const std::string loose = dir.WriteFile("loose", std::string("root:") + kPassword + "\n");
  ASSERT_EQ(::chmod(loose.c_str(), 0644), 0);
  const std::string no_colon = UserFile(dir, "root");
  for (const std::string& file : {loose, no_colon}) {
    ChildProcess master;
    std::string error;
    ASSERT_TRUE(master.Start(BinaryPath("granary-master"),
                             {"--port", std::to_string(PickFreePort()), "--http-port",
                              std::to_string(PickFreePort()), "--etcd", "127.0.0.1:1",
                              "--etcd-auth-file", file},
                             dir.File("master.log"), &error))
        << error;
    auto exit = master.Wait(Millis(10'000));
    ASSERT_TRUE(exit.has_value());
    EXPECT_FALSE(exit->Succeeded());
    const std::string log = master.LogContents();
    EXPECT_NE(log.find("etcd auth file"), std::string::npos) << log;
    EXPECT_EQ(log.find(kPassword), std::string::npos) << "the password in the log";
  }
}

// HA on an etcd with auth: masters, nodes and clients present etcd's user; a failover works.
class EtcdAuthHaTest : public HaTest {
 protected:
  void TearDown() override {
    ::unsetenv("GRANARY_ETCD_AUTH_FILE");
    HaTest::TearDown();
  }
  TempDir dir_;
};

TEST_F(EtcdAuthHaTest, MastersNodesAndClientsWorkOnAnEtcdWithAuth) {
  const std::string user = UserFile(dir_, std::string("root:") + kPassword);
  ::setenv("GRANARY_ETCD_AUTH_FILE", user.c_str(), 1);  // the fixture's clients read it
  cluster_.set_etcd_setup([](const std::string& endpoints) { return EnableAuth(endpoints); });
  ASSERT_TRUE(cluster_.Start(3, 0, 0, {"--etcd-auth-file", user}));
  ASSERT_TRUE(cluster_.AddNode(64 * MiB, {"--etcd-auth-file", user}));
  auto client = cluster_.MakeClient();
  ASSERT_NE(client, nullptr);
  const auto value = testdata::Pattern("on-an-etcd-with-auth", 64 * KiB);
  ASSERT_TRUE(client->Put("on-an-etcd-with-auth", value).ok());
  ASSERT_TRUE(cluster_.WaitForStandbysCaughtUp(Millis(5000)));
  const int leader = cluster_.LeaderIndex();
  ASSERT_GE(leader, 0);
  ASSERT_TRUE(cluster_.master(leader).process().Kill(SIGKILL));
  ASSERT_GE(cluster_.WaitForLeader(Millis(10'000), leader), 0);
  Result<std::vector<std::byte>> got = Status(ErrorCode::RPC_FAIL, "not tried");
  for (int i = 0; i < 20 && !got.ok(); ++i) got = client->Get("on-an-etcd-with-auth");  // bounded
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == value);

  // A client without etcd's user finds no leader.
  ::unsetenv("GRANARY_ETCD_AUTH_FILE");
  ClientOptions o;
  o.master_address = cluster_.address();
  o.cluster_id = cluster_.cluster_id();
  o.rpc_timeout_ms = 2000;
  auto stranger = Client::Connect(o);
  if (stranger.ok()) {
    EXPECT_FALSE((*stranger)->Get("on-an-etcd-with-auth").ok());
  }
}

}  // namespace
}  // namespace granary::it
