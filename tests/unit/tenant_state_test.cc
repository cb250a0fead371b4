// Tenants' namespaces in the master's state (master/state/key_namespace.h): held keys, scopes,
// each tenant's usage through puts, upserts, removals, evictions, unmounts and a snapshot, and
// removals that reach one namespace or every one.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>

#include "master/state/key_namespace.h"
#include "master/state/master_state.h"

namespace granary::master {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::string Held(const std::string& tenant, const std::string& key) {
  return HeldKey(NamespacePrefix(tenant), key);
}

TEST(KeyNamespaceTest, HeldKeysOfNamespacesNeverMeet) {
  EXPECT_EQ(Held("", "k"), "k");
  EXPECT_EQ(Held("acme", "k"), std::string("\0acme\0k", 7));
  EXPECT_EQ(TenantOfKey(Held("acme", "k")), "acme");
  EXPECT_EQ(TenantOfKey("k"), "");
  // A caller's key that begins with the mark becomes the one key no put accepts.
  const std::string forged = Held("acme", "k");
  EXPECT_EQ(Held("", forged), InvalidKeyFromCaller());
  EXPECT_EQ(Held("globex", forged), InvalidKeyFromCaller());
  EXPECT_FALSE(ValidateKey(InvalidKeyFromCaller()).ok());
  EXPECT_FALSE(ValidateKey(std::string("\0acme", 5)).ok());
  EXPECT_FALSE(ValidateKey(std::string("\0acme\0", 6)).ok()) << "a tenant's empty key";
  EXPECT_FALSE(ValidateKey(std::string("\0\0k", 3)).ok()) << "an empty tenant name";
  EXPECT_TRUE(ValidateKey(Held("acme", "k")).ok());

  std::string_view written;
  const KeyScope acme{NamespacePrefix("acme"), false};
  EXPECT_TRUE(acme.Contains(Held("acme", "k"), &written));
  EXPECT_EQ(written, "k");
  EXPECT_FALSE(acme.Contains(Held("acme2", "k"), &written));
  EXPECT_FALSE(acme.Contains("k", &written));
  const KeyScope plain{"", false};
  EXPECT_TRUE(plain.Contains("k", &written));
  EXPECT_FALSE(plain.Contains(Held("acme", "k"), &written));
  const KeyScope every{"", true};
  EXPECT_TRUE(every.Contains(Held("acme", "x"), &written));
  EXPECT_EQ(written, "x");
  EXPECT_TRUE(every.Contains("y", &written));
  EXPECT_EQ(written, "y");
}

class TenantStateTest : public ::testing::Test {
 protected:
  TenantStateTest() : state_(MasterPolicy{}, &clock_) {
    MountResult r = state_.Mount({"node", {"seg", 64 * kMiB, "127.0.0.1:1", "", "", 0, true}});
    EXPECT_TRUE(r.status.ok());
  }
  Status Put(const std::string& key, uint64_t size, bool upsert = false) {
    auto started = state_.PutStart({"w", {key}, {size}, {}, upsert})[0];
    if (!started.status.ok()) return started.status;
    return state_.PutEnd({"w", {key}, {7}, {started.put_gen}})[0];
  }

  ManualClock clock_;
  MasterState state_;
};

TEST_F(TenantStateTest, UsageFollowsEveryWayAnObjectComesAndGoes) {
  const std::string a1 = Held("acme", "1"), a2 = Held("acme", "2");
  auto started = state_.PutStart({"w", {a1}, {kMiB}, {}, false})[0];
  ASSERT_TRUE(started.status.ok());
  EXPECT_EQ(state_.UsageOf("acme").bytes, static_cast<int64_t>(kMiB)) << "counted from the start";
  EXPECT_EQ(state_.UsageOf("acme").objects, 0);
  ASSERT_TRUE(state_.PutEnd({"w", {a1}, {7}, {started.put_gen}})[0].ok());
  EXPECT_EQ(state_.UsageOf("acme").bytes, static_cast<int64_t>(kMiB));
  EXPECT_EQ(state_.UsageOf("acme").objects, 1);
  ASSERT_TRUE(Put(a2, 3 * kMiB).ok());
  ASSERT_TRUE(Put("plain", 5 * kMiB).ok());
  ASSERT_TRUE(Put(Held("globex", "1"), 2 * kMiB).ok());
  EXPECT_EQ(state_.UsageOf("acme").bytes, static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(state_.UsageOf("globex").bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(state_.UsageOf("").bytes, 0) << "the default namespace is not a tenant";

  // An upsert replaces the size; a revoked put gives its bytes back.
  ASSERT_TRUE(Put(a2, kMiB, /*upsert=*/true).ok());
  EXPECT_EQ(state_.UsageOf("acme").bytes, static_cast<int64_t>(2 * kMiB));
  auto revoked = state_.PutStart({"w", {Held("acme", "3")}, {kMiB}, {}, false})[0];
  ASSERT_TRUE(revoked.status.ok());
  ASSERT_TRUE(state_.PutRevoke({"w", {Held("acme", "3")}, {revoked.put_gen}, false})[0].ok());
  EXPECT_EQ(state_.UsageOf("acme").bytes, static_cast<int64_t>(2 * kMiB));

  // The usage of a loaded snapshot is recounted.
  MasterState copy(MasterPolicy{}, &clock_);
  ASSERT_TRUE(copy.LoadSnapshot(state_.EncodeSnapshot()).ok());
  EXPECT_EQ(copy.UsageOf("acme").bytes, static_cast<int64_t>(2 * kMiB));
  EXPECT_EQ(copy.UsageOf("acme").objects, 2);
  EXPECT_EQ(copy.UsageOf("globex").objects, 1);

  // Removal and eviction give bytes back; an unmount takes what only it held.
  ASSERT_TRUE(state_.Remove({{a1}, false})[0].ok());
  EXPECT_EQ(state_.UsageOf("acme").bytes, static_cast<int64_t>(kMiB));
  EvictResult evicted = state_.Evict({{a2}, false, {}, false});
  EXPECT_EQ(evicted.objects, 1u);
  EXPECT_EQ(state_.UsageOf("acme").bytes, 0);
  EXPECT_EQ(state_.UsageOf("acme").objects, 0);
  ASSERT_TRUE(state_.Unmount({"node", "seg"}).status.ok());
  EXPECT_EQ(state_.UsageOf("globex").bytes, 0);
  EXPECT_EQ(state_.UsageOf("globex").objects, 0);
}

// The quota check of a put reads the tenant's usage under the tenant's lock, while other puts
// end without it: a put's end must never let the usage dip below what is pending or committed,
// or a check in that moment admits an object past the quota (TenantsTest.ConcurrentPuts...).
TEST_F(TenantStateTest, UsageNeverDipsWhilePutsEndAndUpsertsReplace) {
  std::atomic<bool> done{false};
  std::atomic<int64_t> lowest_seen_gap{0};
  std::atomic<int64_t> floor{0};  // bytes the writer has made count for good
  std::thread reader([&] {
    while (!done.load()) {
      const int64_t f = floor.load();
      const int64_t bytes = state_.UsageOf("acme").bytes;
      if (bytes < f) lowest_seen_gap = std::min(lowest_seen_gap.load(), bytes - f);
    }
  });
  for (int i = 0; i < 3000; ++i) {
    const std::string key = Held("acme", std::to_string(i % 40));
    // Puts of new keys, then upserts of the same 40 keys at the same size: usage only rises.
    ASSERT_TRUE(Put(key, 4096, /*upsert=*/i >= 40).ok()) << i;
    if (i < 40) floor.fetch_add(4096);
  }
  done = true;
  reader.join();
  EXPECT_EQ(lowest_seen_gap.load(), 0) << "usage was seen below what the tenant holds";
  EXPECT_EQ(state_.UsageOf("acme").bytes, 40 * 4096);
}

TEST_F(TenantStateTest, ScopedRemovalsAndQueriesReachTheirNamespacesOnly) {
  for (const std::string& tenant : {std::string(), std::string("acme"), std::string("globex")}) {
    ASSERT_TRUE(Put(Held(tenant, "job/1"), 4096).ok());
    ASSERT_TRUE(Put(Held(tenant, "job/2"), 4096).ok());
    ASSERT_TRUE(Put(Held(tenant, "other"), 4096).ok());
  }
  const KeyScope acme{NamespacePrefix("acme"), false};
  auto listed = state_.QueryByRegex("^job/", 100, &acme);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->objects.size(), 2u);
  for (const auto& row : listed->objects) EXPECT_EQ(row.key.rfind("job/", 0), 0u) << row.key;

  // A tenant's regex removal, matched against its keys as written ("^" anchors there).
  RemoveCountResult r = state_.RemoveScoped({NamespacePrefix("acme"), false, "^job/", false});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.removed, 2u);
  // The default namespace's remove-all leaves the tenants' keys.
  r = state_.RemoveScoped({"", false, "", false});
  EXPECT_EQ(r.removed, 3u);
  EXPECT_EQ(state_.BatchExist({Held("globex", "job/1")})[0], 1);
  EXPECT_EQ(state_.BatchExist({Held("acme", "other")})[0], 1);
  // Every namespace, matched as written: globex's two jobs.
  r = state_.RemoveScoped({"", true, "^job/", false});
  EXPECT_EQ(r.removed, 2u);
  EXPECT_EQ(state_.object_count(), 2u);  // each tenant's "other"
  EXPECT_FALSE(state_.RemoveScoped({"", true, "(", false}).status.ok()) << "a bad pattern";
}

}  // namespace
}  // namespace granary::master
