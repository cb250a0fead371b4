// The client's read-lock releases (client/read_releaser.h) with real processes: a Get's read lock
// is gone from the master within about a millisecond, also after the releaser has gone idle and
// sleeps, so an idle client neither polls nor holds locks to their lease TTL.
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "../tools/test_pattern.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using Bytes = std::vector<std::byte>;
using SteadyClock = std::chrono::steady_clock;

class ReadReleaseTest : public StoreTest {
 protected:
  // How long until the master shows no read lock on `key`; nullopt if not within `limit`.
  std::optional<Millis> TimeUntilUnlocked(Client& client, const std::string& key, Millis limit) {
    const auto start = SteadyClock::now();
    const bool unlocked = WaitUntil(
        [&] {
          auto st = client.Stat(key);
          return st.ok() && st->read_locks == 0;
        },
        limit, Millis(2));
    if (!unlocked) return std::nullopt;
    return std::chrono::duration_cast<Millis>(SteadyClock::now() - start);
  }
};

TEST_F(ReadReleaseTest, AGetsLockIsReleasedPromptlyAlsoAfterTheReleaserWentIdle) {
  // A 30 s lease: a release that never came would show as a lock held for 30 s.
  ASSERT_TRUE(cluster_.Start(1, 64 * MiB, {{"--lease-ttl", "30s"}}));
  auto client = cluster_.MakeClient(false);
  ASSERT_NE(client, nullptr);
  const std::string key = "released/object";
  const Bytes value = testdata::Pattern(key, 64 * KiB);
  ASSERT_TRUE(client->Put(key, ByteSpan(value)).ok());

  for (int round = 0; round < 3; ++round) {
    auto got = client->Get(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, value);
    auto took = TimeUntilUnlocked(*client, key, Millis(2000));
    ASSERT_TRUE(took.has_value()) << "round " << round << ": the read lock was not released";
    // Idle long enough for the releaser to stop polling and sleep (~100 ms without a key).
    std::this_thread::sleep_for(Millis(400));
  }
  // And the object is removable at once, as no lock is left.
  EXPECT_TRUE(client->Remove(key).ok());
}

}  // namespace
}  // namespace granary::it
