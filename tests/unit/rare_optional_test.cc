// RareOptional behaves as std::optional for what ObjectMeta does with it, and costs one pointer.
#include "common/rare_optional.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "master/state/object_meta.h"

namespace granary {
namespace {

struct Record {
  std::string name;
  std::vector<int> items;
};

TEST(RareOptionalTest, EmptyCostsOnePointerAndHoldsNothing) {
  static_assert(sizeof(RareOptional<Record>) == sizeof(void*));
  RareOptional<Record> r;
  EXPECT_FALSE(r.has_value());
  EXPECT_FALSE(r);
  RareOptional<Record> none = std::nullopt;
  EXPECT_FALSE(none);
}

TEST(RareOptionalTest, CopiesAreDeepAndIndependent) {
  RareOptional<Record> a = Record{"a", {1, 2}};
  RareOptional<Record> b = a;
  ASSERT_TRUE(b);
  b->name = "b";
  b->items.push_back(3);
  EXPECT_EQ(a->name, "a");
  EXPECT_EQ(a->items.size(), 2u);
  EXPECT_EQ(b->items.size(), 3u);

  RareOptional<Record> c;
  c = a;  // copy-assign into empty
  EXPECT_EQ(c->name, "a");
  c = RareOptional<Record>();  // assign empty
  EXPECT_FALSE(c);
  a = a;  // self-assignment keeps the value
  ASSERT_TRUE(a);
  EXPECT_EQ(a->name, "a");
}

TEST(RareOptionalTest, MovesLeaveTheSourceEmpty) {
  RareOptional<Record> a = Record{"a", {1}};
  RareOptional<Record> b = std::move(a);
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): the promise under test
  ASSERT_TRUE(b);
  EXPECT_EQ(b->name, "a");
}

TEST(RareOptionalTest, AssignEmplaceResetAsOptional) {
  RareOptional<Record> r;
  r = Record{"x", {}};
  EXPECT_EQ((*r).name, "x");
  const Record* before = &*r;
  r = Record{"y", {4}};  // assigning a value reuses the held allocation
  EXPECT_EQ(&*r, before);
  EXPECT_EQ(r->name, "y");
  r.emplace(Record{"z", {}});
  EXPECT_EQ(r->name, "z");
  r = std::nullopt;
  EXPECT_FALSE(r);
  r.emplace();
  EXPECT_TRUE(r);
  EXPECT_TRUE(r->name.empty());
  r.reset();
  EXPECT_FALSE(r.has_value());
}

// The point of the type: the per-object record the master keeps for every key stays small
// (issue 23: it was 528 bytes with the rare records inline, 144 with one pointer for each).
TEST(RareOptionalTest, ObjectMetaKeepsItsRareRecordsOutOfLineInOneBlock) {
  EXPECT_LE(sizeof(master::ObjectMeta), 112u);
  master::ObjectMeta meta;
  meta.set_pending(master::PendingWrite{"client", 7, {}, {}, 0, false});
  master::ObjectMeta copy = meta;
  copy.pending_mut().gen = 8;
  EXPECT_EQ(meta.pending()->gen, 7u) << "a copy has its own block";
  EXPECT_FALSE(copy.demotion());
  EXPECT_FALSE(copy.promotion());
  master::ObjectMeta moved = std::move(copy);
  EXPECT_EQ(moved.pending()->gen, 8u);
}

// ObjectMeta's promise: the rare block is made by the first rare field set and freed by the call
// that empties its last one, whichever field and call that is, so a master whose objects were
// all written, read, demoted, promoted and pinned once holds no block for any of them.
TEST(RareOptionalTest, TheRareBlockGoesWithItsLastField) {
  master::ObjectMeta meta;
  EXPECT_FALSE(meta.has_rare_block());
  EXPECT_FALSE(meta.pending());
  EXPECT_TRUE(meta.readers().empty());
  meta.ReleaseReadLock("nobody");
  meta.DropExpiredLocks(100);
  meta.ClearReadLocks();
  meta.reset_pending();
  EXPECT_FALSE(meta.has_rare_block()) << "reads and resets of absent fields make no block";

  meta.TakeReadLock("a", 50);
  meta.TakeReadLock("a", 60);
  meta.TakeReadLock("b", 40);
  ASSERT_EQ(meta.readers().size(), 2u);
  EXPECT_EQ(meta.readers()[0].count, 2u);
  EXPECT_EQ(meta.readers()[0].expiry_ms, 60);
  EXPECT_EQ(meta.LatestLockExpiry(), 60);
  EXPECT_FALSE(meta.ReleaseReadLock("a", /*now_ms=*/60)) << "an expired lock is not released";
  EXPECT_TRUE(meta.ReleaseReadLock("a", 59));
  EXPECT_TRUE(meta.has_rare_block());
  meta.set_soft_pin(master::SoftPin{10, 5});
  meta.set_demotion(master::Demotion{"node", 3, 0, {}, 0, 9});
  meta.HoldForDemotion(std::vector<master::Extent>{{1, 0, 64}});
  EXPECT_EQ(meta.demotion()->held.size(), 1u);
  EXPECT_EQ(meta.demotion()->hold_until_ms, 60) << "held until its read locks expire";
  EXPECT_TRUE(meta.ReleaseReadLock("a"));
  meta.DropExpiredLocks(40);  // b's lock expires at 40
  EXPECT_TRUE(meta.readers().empty());
  meta.reset_soft_pin();
  EXPECT_TRUE(meta.has_rare_block()) << "the demotion is still there";
  meta.set_promotion(master::Promotion{"node", 3, {}, 0, 1, 0, false});
  meta.reset_demotion();
  EXPECT_TRUE(meta.has_rare_block());
  meta.reset_promotion();
  EXPECT_FALSE(meta.has_rare_block()) << "the last field took the block with it";

  meta.TakeReadLock("c", 10);
  meta.ClearReadLocks();
  EXPECT_FALSE(meta.has_rare_block());
  meta.TakeReadLock("c", 10);
  EXPECT_TRUE(meta.ReleaseReadLock("c"));
  EXPECT_FALSE(meta.has_rare_block());
  meta.set_pending(master::PendingWrite{"client", 7, {}, {}, 0, false});
  meta.reset_pending();
  EXPECT_FALSE(meta.has_rare_block());
}

}  // namespace
}  // namespace granary
