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
// (issue 23: it was 528 bytes with the rare records inline).
TEST(RareOptionalTest, ObjectMetaKeepsItsRareRecordsOutOfLine) {
  EXPECT_LE(sizeof(master::ObjectMeta), 184u);
  master::ObjectMeta meta;
  meta.pending = master::PendingWrite{"client", 7, {}, {}, 0, false};
  master::ObjectMeta copy = meta;
  copy.pending->gen = 8;
  EXPECT_EQ(meta.pending->gen, 7u);
  EXPECT_FALSE(copy.demotion);
  EXPECT_FALSE(copy.promotion);
}

}  // namespace
}  // namespace granary
