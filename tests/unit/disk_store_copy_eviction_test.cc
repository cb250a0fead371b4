// Copy-grained lru (disk_store.h, EvictionPolicy::kLru): on the bucket backend, where the
// filesystem punches holes, eviction takes the least recently used copy and gives its space back
// while its bucket keeps the others; lru-units keeps whole-bucket eviction. The fixture and its
// instantiation: disk_store_fixture.h, disk_store_test.cc. Bucket-only tests skip elsewhere.
#include <fcntl.h>

#include "disk/layout.h"
#include "disk_store_fixture.h"

namespace granary::disk::store_test {
namespace {

constexpr size_t kValue = 65536;

class CopyEvictionTest : public DiskStoreTest {
 protected:
  // Whether this is the bucket backend on a filesystem that punches holes (the store's own probe
  // on the test's directory).
  bool CopyGrained() {
    return GetParam().backend == DiskBackend::kBucket && PunchesHoles(dir_.path());
  }
  DiskStoreOptions LruOptions() const {
    DiskStoreOptions o = Options();
    o.eviction = EvictionPolicy::kLru;
    o.bucket_max_keys = 8;
    return o;
  }
  static std::vector<size_t> Eight() { return std::vector<size_t>(8, kValue); }
  // Exactly one victim for one byte: its key (else how many there were).
  static std::string EvictOne(DiskStore& store) {
    auto victims = store.SelectVictims(1);
    return victims.size() == 1 ? victims[0].key : std::to_string(victims.size()) + " victims";
  }
  static std::vector<StoredObject> Without(std::vector<StoredObject> objects, const std::string& key) {
    std::erase_if(objects, [&](const StoredObject& o) { return o.key == key; });
    return objects;
  }
};

TEST_P(CopyEvictionTest, LruTakesTheLeastRecentlyUsedCopyNotItsWholeBucket) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  auto store = Open(LruOptions());
  ASSERT_TRUE(store);
  auto a = WriteAll(*store, "A", Eight());  // one bucket
  auto b = WriteAll(*store, "B", Eight());  // another, written later
  ExpectReadable(*store, {a[0]});           // A0 is now the most recently used
  ASSERT_EQ(store->Usage().files, 2u);
  const uint64_t used = store->Usage().used;

  auto victims = store->SelectVictims(1);
  ASSERT_EQ(victims.size(), 1u) << "one copy frees a byte: not a bucket of eight";
  EXPECT_EQ(victims[0].key, "A1") << "A1..A7 are the least recently used, A1 first";
  EXPECT_EQ(ReadOne(*store, "A1").status.code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(store->Usage().reclaiming, kValue);
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  EXPECT_EQ(store->Usage().used, used - kValue) << "the copy's value went back, its bucket stayed";
  EXPECT_EQ(store->Usage().reclaiming, 0u);
  EXPECT_EQ(store->Usage().files, 2u);
  EXPECT_EQ(store->Usage().objects, 15u);
  ExpectReadable(*store, Without(a, "A1"));
  ExpectReadable(*store, b);

  // Every copy, one by one: the buckets go with their last copies, and nothing stays charged.
  auto rest = store->SelectVictims(1ull << 30);
  EXPECT_EQ(rest.size(), 15u);
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Usage().files, 0u);
  EXPECT_EQ(store->Usage().objects, 0u);
}

TEST_P(CopyEvictionTest, LruUnitsEvictsWholeBuckets) {
  if (GetParam().backend != DiskBackend::kBucket) GTEST_SKIP() << "buckets only";
  DiskStoreOptions o = LruOptions();
  o.eviction = EvictionPolicy::kLruUnits;
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto a = WriteAll(*store, "A", Eight());
  auto b = WriteAll(*store, "B", Eight());
  ExpectReadable(*store, {a[0]});  // the whole bucket A becomes the most recently used
  auto victims = store->SelectVictims(1);
  ASSERT_EQ(victims.size(), 8u);
  for (const auto& v : victims) EXPECT_EQ(v.key[0], 'B') << v.key;
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  EXPECT_EQ(store->Usage().files, 1u);
  ExpectReadable(*store, a);
}

TEST_P(CopyEvictionTest, AnEvictedCopyStaysGoneAfterACloseOrACrash) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  DiskStoreOptions o = LruOptions();
  std::vector<StoredObject> a;
  uint64_t used = 0;
  {
    auto store = Open(o);
    ASSERT_TRUE(store);
    a = WriteAll(*store, "A", Eight());
    ExpectReadable(*store, Without(a, "A5"));  // A5 the least recently used
    ASSERT_EQ(EvictOne(*store), "A5");
    ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
    used = store->Usage().used;
  }
  {
    auto store = Open(o);
    ASSERT_TRUE(store);
    auto listed = Listed(*store);
    EXPECT_EQ(listed.size(), 7u);
    EXPECT_EQ(listed.count("A5"), 0u) << "its tombstone keeps it gone";
    EXPECT_EQ(store->Usage().used, used) << "its punched space is not counted again";
    ExpectReadable(*store, Without(a, "A5"));
  }
  // The same in a process that dies right after reclaiming (no destructor).
  std::string outcome = InChildThenCrash(o, [](DiskStore& store) -> std::string {
    auto victims = store.SelectVictims(1);
    if (victims.size() != 1) return "expected one victim, got " + std::to_string(victims.size());
    Status st = store.ReclaimVictims(std::chrono::milliseconds(1000));
    return st.ok() ? "" : st.ToString();
  });
  ASSERT_EQ(outcome, "");
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto listed = Listed(*store);
  EXPECT_EQ(listed.size(), 6u);
  EXPECT_EQ(listed.count("A5"), 0u);
  std::vector<StoredObject> left;
  for (const auto& [key, object] : listed) left.push_back(object);
  ExpectReadable(*store, left);
}

// The header's promise: a hole is given back only once no read of its copy is in flight, and
// the read that was in flight gets the copy's bytes.
TEST_P(CopyEvictionTest, AnEvictedCopysSpaceWaitsForItsReadInFlight) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  std::unique_ptr<DiskStore> store;  // declared first: it outlives the held read
  HeldRead held(kValue);
  store = OpenHeld(LruOptions(), held);
  ASSERT_TRUE(store);
  auto a = WriteAll(*store, "A", Eight());
  held.Start(*store, a[1].key, a[1].location);
  // Everything else used after A1's read began: A1 is the least recently used, while read.
  auto b = WriteAll(*store, "B", Eight());
  ExpectReadable(*store, Without(a, "A1"));
  const uint64_t used = store->Usage().used;
  ASSERT_EQ(EvictOne(*store), "A1");
  Status st = store->ReclaimVictims(std::chrono::milliseconds(100));
  EXPECT_EQ(st.code(), ErrorCode::OBJECT_HAS_LEASE) << st.ToString();
  EXPECT_EQ(store->Usage().used, used) << "not given back under the read";
  held.Finish();
  EXPECT_TRUE(held.GotBytesOf("A1", 1)) << held.result.status.ToString();
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  EXPECT_EQ(store->Usage().used, used - kValue);
  ExpectReadable(*store, Without(a, "A1"));
  ExpectReadable(*store, b);
}

// A read that looked the copy up before its eviction, and pins it only after its space went
// back, must find it gone: a miss, never the zeros of the hole.
TEST_P(CopyEvictionTest, ACopyEvictedBetweenItsLookupAndItsPinIsAMissNotAHole) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  std::unique_ptr<DiskStore> store;  // declared first: it outlives the held read
  HeldRead held(kValue);
  store = OpenHeld(LruOptions(), held, &DiskStoreOptions::test_hook_after_lookup);
  ASSERT_TRUE(store);
  auto a = WriteAll(*store, "A", Eight());
  ExpectReadable(*store, Without(a, "A1"));  // A1 the least recently used
  held.Start(*store, a[1].key, a[1].location);  // looked up, not pinned
  const uint64_t used = store->Usage().used;
  ASSERT_EQ(EvictOne(*store), "A1");
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok()) << "nothing pins it yet";
  EXPECT_EQ(store->Usage().used, used - kValue) << "its value is punched out";
  held.Finish();
  EXPECT_EQ(held.result.status.code(), ErrorCode::OBJECT_NOT_FOUND) << held.result.status.ToString();
  ExpectReadable(*store, Without(a, "A1"));
}

// Readers are counted per copy: a read of another copy of the bucket does not hold a hole back.
TEST_P(CopyEvictionTest, AReadOfAnotherCopyDoesNotHoldAHoleBack) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  std::unique_ptr<DiskStore> store;  // declared first: it outlives the held read
  HeldRead held(kValue);
  store = OpenHeld(LruOptions(), held);
  ASSERT_TRUE(store);
  auto a = WriteAll(*store, "A", Eight());
  held.Start(*store, a[0].key, a[0].location);  // A0 pinned: the most recently used, A1 the least
  const uint64_t used = store->Usage().used;
  ASSERT_EQ(EvictOne(*store), "A1");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(5000)).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << "did not wait for A0's read";
  EXPECT_EQ(store->Usage().used, used - kValue);
  held.Finish();
  EXPECT_TRUE(held.GotBytesOf("A0", 1)) << held.result.status.ToString();
}

// A copy tombstoned but not yet punched when the process died (Remove queues its hole for the
// next reclaim) is punched by the next open: its space is not charged for as long as its bucket
// lives.
TEST_P(CopyEvictionTest, RecoveryGivesBackWhatACrashLeftTombstonedButNotPunched) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  DiskStoreOptions o = LruOptions();
  std::vector<StoredObject> a;
  {
    auto store = Open(o);
    ASSERT_TRUE(store);
    a = WriteAll(*store, "A", Eight());
  }
  uint64_t used = 0;
  {
    auto store = Open(o);
    ASSERT_TRUE(store);
    used = store->Usage().used;
  }
  const uint64_t location = a[3].location;
  std::string outcome = InChildThenCrash(o, [location](DiskStore& store) -> std::string {
    Status st = store.Remove("A3", location);  // tombstoned; its hole waits for a reclaim
    return st.ok() ? "" : st.ToString();
  });
  ASSERT_EQ(outcome, "");
  auto store = Open(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->Usage().used, used - kValue);
  auto listed = Listed(*store);
  EXPECT_EQ(listed.count("A3"), 0u);
  ExpectReadable(*store, Without(a, "A3"));
}

// Whether the filesystem punches holes is probed on a scratch file: the store's own files, the
// tombstone log above all, are never punched by the probe (a log past the probe's offset lost
// its records to it once).
TEST_P(CopyEvictionTest, OpeningNeverPunchesTheTombstoneLog) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  DiskStoreOptions o = LruOptions();
  {
    auto store = Open(o);
    ASSERT_TRUE(store);
    auto a = WriteAll(*store, "A", Eight());
    ASSERT_TRUE(store->Remove("A3", a[3].location).ok());
  }
  // The log's records moved to just past 1 GiB (a sparse file: the zeros before them read as
  // damaged records, skipped), where the old probe punched its block.
  const std::string log = dir_.path() + "/buckets/tombstones";
  std::string records;
  {
    int fd = ::open(log.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    char buf[4096];
    ssize_t n;
    off_t at = 0;
    while ((n = ::pread(fd, buf, sizeof(buf), at)) > 0) {
      records.append(buf, static_cast<size_t>(n));
      at += n;
    }
    ASSERT_GE(records.size(), 48u);
    const off_t moved = ((off_t{1} << 30) / 48 + 1) * 48;
    ASSERT_EQ(::ftruncate(fd, 0), 0);
    ASSERT_EQ(::pwrite(fd, records.data(), records.size(), moved), static_cast<ssize_t>(records.size()));
    ::close(fd);
  }
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto listed = Listed(*store);
  EXPECT_EQ(listed.count("A3"), 0u) << "its tombstone was kept";
  EXPECT_EQ(listed.size(), 7u);
  std::vector<StoredObject> left;
  for (const auto& [key, object] : listed) left.push_back(object);
  ExpectReadable(*store, left);
}

TEST_P(CopyEvictionTest, RemovingACopyGivesItsSpaceBackWhileItsBucketStays) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  DiskStoreOptions o = LruOptions();
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto a = WriteAll(*store, "A", Eight());
  const uint64_t used = store->Usage().used;
  ASSERT_TRUE(store->Remove("A3", a[3].location).ok());
  // Replacing a copy with a new generation leaves the old one's space the same way.
  std::vector<std::byte> v2 = ValueFor("A6", 2, kValue);
  ObjectWrite replace{"A6", 2, v2, {}};
  ASSERT_TRUE(store->Write(std::span(&replace, 1))[0].ok());
  const uint64_t before = store->Usage().used;
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  EXPECT_EQ(store->Usage().used, before - 2 * kValue) << "A3's and the old A6's values";
  EXPECT_GT(before, used);
  EXPECT_EQ(store->Usage().files, 2u);
  auto listed = Listed(*store);
  EXPECT_EQ(listed.count("A3"), 0u);
  EXPECT_EQ(listed.at("A6").gen, 2u);
  store.reset();
  store = Open(o);
  ASSERT_TRUE(store);
  listed = Listed(*store);
  EXPECT_EQ(listed.count("A3"), 0u);
  EXPECT_EQ(listed.at("A6").gen, 2u);
  std::vector<StoredObject> left;
  for (const auto& [key, object] : listed) left.push_back(object);
  ExpectReadable(*store, left);
}

// The bucket's share of the budget bounds what one eviction frees when eviction takes buckets;
// when it takes copies, a bucket is as large as bucket_max_bytes and bucket_max_keys allow.
TEST_P(CopyEvictionTest, BucketsAreNotCutToAShareOfTheBudgetWhenEvictionTakesCopies) {
  if (!CopyGrained()) GTEST_SKIP() << "bucket backend on a filesystem that punches holes only";
  EXPECT_EQ(BucketBytes(1ull << 30, 256ull << 20, true), 256u << 20);
  DiskStoreOptions o = LruOptions();
  o.disk_size = 1ull << 30;  // a share would be 2 MiB: 32 values of 64 KiB
  o.bucket_max_keys = 500;
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto objects = WriteAll(*store, "b", std::vector<size_t>(96, kValue));
  ASSERT_EQ(objects.size(), 96u);
  EXPECT_EQ(store->Usage().files, 1u);
  ExpectReadable(*store, objects);
}

INSTANTIATE_TEST_SUITE_P(Disk, CopyEvictionTest,
                         ::testing::Values(StoreParam{DiskBackend::kBucket, IoMode::kUring, true},
                                           StoreParam{DiskBackend::kBucket, IoMode::kPosix, true},
                                           StoreParam{DiskBackend::kBucket, IoMode::kUring, false}),
                         ParamName);

}  // namespace
}  // namespace granary::disk::store_test
