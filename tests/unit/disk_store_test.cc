// The disk tier's behaviour, the same tests for every backend x I/O path (x O_DIRECT or not):
// batches written and read back byte-exact, write-once per generation, recovery after reopen,
// remove (and that a removed or replaced copy never comes back, even after a crash). Budget,
// eviction, damaged files, reads in flight, hostile requests and concurrency:
// disk_store_eviction_test.cc; the fixture: disk_store_fixture.h.
#include "disk_store_fixture.h"

namespace granary::disk::store_test {
namespace {

TEST_P(DiskStoreTest, WritesAndReadsBatchesByteExact) {
  auto store = Open();
  ASSERT_TRUE(store);
  EXPECT_EQ(store->backend(), GetParam().backend);
  EXPECT_EQ(store->io_mode(), GetParam().io);
  EXPECT_EQ(store->direct_io(), GetParam().direct);
  // 40 objects: more than one queue depth, sizes around every block boundary.
  std::vector<size_t> sizes;
  const size_t shapes[] = {1, 4095, 4096, 4097, 65536, (1 << 20) + 3, 0, 12345};
  for (int i = 0; i < 40; ++i) sizes.push_back(shapes[i % 8]);
  auto objects = WriteAll(*store, "k", sizes);
  ASSERT_EQ(objects.size(), 40u);
  std::set<uint64_t> locations;
  for (size_t i = 0; i < objects.size(); ++i) {
    EXPECT_NE(objects[i].location, 0u);
    EXPECT_EQ(objects[i].size, sizes[i]);
    EXPECT_EQ(objects[i].checksum, Checksum(ValueFor(objects[i].key, 1, sizes[i])));
    EXPECT_GE(objects[i].length, sizes[i]);
    locations.insert(objects[i].location);
    auto found = store->Lookup(objects[i].key);
    ASSERT_TRUE(found);
    EXPECT_EQ(found->location, objects[i].location);
  }
  EXPECT_EQ(locations.size(), objects.size()) << "every copy has its own location";
  ExpectReadable(*store, objects);
  DiskUsage usage = store->Usage();
  EXPECT_EQ(usage.objects, 40u);
  EXPECT_GT(usage.used, 0u);
  EXPECT_EQ(usage.reclaiming, 0u);
  EXPECT_LE(usage.used, usage.capacity);
}

// Where eviction takes whole buckets (fifo here), a bucket holds at most 1/1024 of the budget
// (not below 2 MiB), whatever bucket_max_bytes says: on a small disk eviction then frees space in
// small steps. (Where it takes copies: disk_store_copy_eviction_test.cc.)
TEST_P(DiskStoreTest, ABucketHoldsAtMostAShareOfTheBudget) {
  if (GetParam().backend != DiskBackend::kBucket) GTEST_SKIP() << "buckets only";
  EXPECT_EQ(BucketBytes(1ull << 30, 256ull << 20, false), 2u << 20) << "the floor";
  EXPECT_EQ(BucketBytes(4ull << 30, 256ull << 20, false), 4u << 20);
  EXPECT_EQ(BucketBytes(4ull << 40, 256ull << 20, false), 256u << 20) << "bucket_max_bytes";
  EXPECT_EQ(BucketBytes(4ull << 30, 64u << 10, false), 64u << 10);
  const std::vector<size_t> sizes(96, 64 * 1024);  // 6 MiB in one batch
  for (const auto& [budget, files] : {std::pair<uint64_t, uint64_t>{1ull << 30, 3},  // 32 a bucket
                                      std::pair<uint64_t, uint64_t>{4ull << 30, 2}}) {  // 64
    TempDir dir;
    DiskStoreOptions o = Options();
    o.dir = dir.path();
    o.disk_size = budget;
    o.bucket_max_keys = 500;
    auto store = Open(o);
    ASSERT_TRUE(store);
    auto objects = WriteAll(*store, "b", sizes);
    ASSERT_EQ(objects.size(), sizes.size());
    EXPECT_EQ(store->Usage().files, files) << "budget " << budget;
    ExpectReadable(*store, objects);
  }
  // An object larger than a bucket's share still gets a bucket of its own.
  TempDir dir;
  DiskStoreOptions o = Options();
  o.dir = dir.path();
  o.disk_size = 1ull << 30;
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto large = WriteAll(*store, "large", {3 << 20, 3 << 20});
  ASSERT_EQ(large.size(), 2u);
  EXPECT_EQ(store->Usage().files, 2u);
  ExpectReadable(*store, large);
}

TEST_P(DiskStoreTest, SameGenerationIsWrittenOnceNewGenerationReplaces) {
  auto store = Open();
  ASSERT_TRUE(store);
  auto first = WriteAll(*store, "obj", {100000});
  ASSERT_EQ(first.size(), 1u);
  const uint64_t used = store->Usage().used;
  // Same key and generation, other bytes: nothing changes.
  auto other = ValueFor("something else", 9, 100000);
  ObjectWrite again{"obj0", 1, other, {}};
  auto r = store->Write(std::span(&again, 1));
  ASSERT_TRUE(r[0].ok());
  EXPECT_EQ(r[0]->location, first[0].location);
  EXPECT_EQ(store->Usage().used, used);
  ExpectReadable(*store, first);
  // A new generation replaces it; the old location no longer reads.
  auto second = WriteAll(*store, "obj", {5000}, 2);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_NE(second[0].location, first[0].location);
  ExpectReadable(*store, second);
  EXPECT_EQ(ReadOne(*store, "obj0", first[0].location).status.code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(store->Usage().objects, 1u);
}

TEST_P(DiskStoreTest, ReopenRecoversEveryObject) {
  std::vector<StoredObject> written;
  uint64_t used = 0;
  {
    auto store = Open();
    ASSERT_TRUE(store);
    written = WriteAll(*store, "a", {65536, 1, 200000, 4096, 70000});
    auto more = WriteAll(*store, "b", {300000, 8192});
    written.insert(written.end(), more.begin(), more.end());
    ASSERT_TRUE(store->Remove("a1").ok());
    written.erase(written.begin() + 1);
    used = store->Usage().used;
  }
  auto store = Open();
  ASSERT_TRUE(store);
  EXPECT_EQ(store->recovery().units_discarded, 0u)
      << (store->recovery().problems.empty() ? "" : store->recovery().problems.front());
  auto listed = store->ListObjects();
  std::map<std::string, StoredObject> by_key;
  for (auto& o : listed) by_key[o.key] = o;
  for (const auto& w : written) {
    ASSERT_TRUE(by_key.count(w.key)) << w.key << " not recovered";
    const StoredObject& got = by_key[w.key];
    EXPECT_EQ(got.gen, w.gen);
    EXPECT_EQ(got.size, w.size);
    EXPECT_EQ(got.checksum, w.checksum);
    EXPECT_EQ(got.location, w.location) << "locations stay valid across restarts";
  }
  EXPECT_EQ(listed.size(), written.size()) << "the removed a1 is not recovered";
  EXPECT_FALSE(store->Lookup("a1"));
  EXPECT_EQ(store->Usage().used, used);
  ExpectReadable(*store, written);
  // New writes after recovery get fresh locations and do not disturb the recovered ones.
  auto fresh = WriteAll(*store, "c", {4096, 65536});
  for (const auto& f : fresh) {
    for (const auto& w : written) EXPECT_NE(f.location, w.location);
  }
  ExpectReadable(*store, written);
  ExpectReadable(*store, fresh);
}

TEST_P(DiskStoreTest, RemoveDropsTheObjectAndFreesItsSpace) {
  auto store = Open();
  ASSERT_TRUE(store);
  auto objects = WriteAll(*store, "r", {65536, 65536, 65536});
  ASSERT_EQ(objects.size(), 3u);
  EXPECT_EQ(store->Remove("r1", objects[0].location).code(), ErrorCode::OBJECT_NOT_FOUND)
      << "a location naming another copy removes nothing";
  ASSERT_TRUE(store->Remove("r1", objects[1].location).ok());
  EXPECT_EQ(store->Remove("r1").code(), ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(ReadOne(*store, "r1").status.code(), ErrorCode::OBJECT_NOT_FOUND);
  ExpectReadable(*store, {objects[0], objects[2]});
  ASSERT_TRUE(store->Remove("r0").ok());
  ASSERT_TRUE(store->Remove("r2").ok());
  DiskUsage usage = store->Usage();
  EXPECT_EQ(usage.objects, 0u);
  EXPECT_EQ(usage.used, 0u) << "every file is gone once its objects are";
  EXPECT_EQ(usage.files, 0u);
}

TEST_P(DiskStoreTest, ReadReportsTheStoredChecksum) {
  std::vector<StoredObject> objects;
  {
    auto store = Open();
    ASSERT_TRUE(store);
    objects = WriteAll(*store, "sum", {0, 1, 4096, 70001});
    ASSERT_EQ(objects.size(), 4u);
    for (const auto& o : objects) {
      auto got = ReadOne(*store, o.key, o.location);
      ASSERT_TRUE(got.status.ok()) << got.status.ToString();
      EXPECT_EQ(got.checksum, Checksum(ValueFor(o.key, 1, o.size))) << o.key;
      EXPECT_EQ(got.checksum, o.checksum) << o.key;
    }
    EXPECT_NE(objects[1].checksum, objects[3].checksum);
  }
  auto store = Open();
  ASSERT_TRUE(store);
  for (const auto& o : objects) {
    auto got = ReadOne(*store, o.key, o.location);
    ASSERT_TRUE(got.status.ok()) << got.status.ToString();
    EXPECT_EQ(got.checksum, o.checksum) << o.key << ": the checksum survives recovery";
  }
}

// A removed copy stays removed after a crash right after Remove returned, and after a clean
// close; the other copies of its bucket (bucket_max_keys 8: all five share one) survive.
TEST_P(DiskStoreTest, RemovedCopiesNeverComeBack) {
  std::vector<StoredObject> objects;
  const std::string crash = InChildThenCrash(Options(), [&](DiskStore& store) -> std::string {
    objects = WriteAll(store, "g", {65536, 4096, 0, 70000, 12345});
    if (objects.size() != 5) return "write";
    if (!store.Remove("g1", objects[1].location).ok()) return "remove g1";
    if (!store.Remove("g3").ok()) return "remove g3";
    return "";
  });
  ASSERT_EQ(crash, "");
  {
    auto store = Open();
    ASSERT_TRUE(store);
    EXPECT_EQ(store->recovery().units_discarded, 0u) << "a removal is not a torn write";
    auto listed = Listed(*store);
    EXPECT_EQ(listed.size(), 3u);
    EXPECT_FALSE(listed.count("g1"));
    EXPECT_FALSE(listed.count("g3"));
    EXPECT_FALSE(store->Lookup("g1"));
    EXPECT_FALSE(store->Lookup("g3"));
    EXPECT_EQ(ReadOne(*store, "g1").status.code(), ErrorCode::OBJECT_NOT_FOUND);
    EXPECT_EQ(ReadOne(*store, "g3").status.code(), ErrorCode::OBJECT_NOT_FOUND);
    EXPECT_EQ(store->Remove("g1").code(), ErrorCode::OBJECT_NOT_FOUND);
    std::vector<StoredObject> kept;
    for (const char* key : {"g0", "g2", "g4"}) {
      ASSERT_TRUE(listed.count(key)) << key << " was not removed";
      kept.push_back(listed[key]);
    }
    ExpectReadable(*store, kept);
    EXPECT_EQ(store->Usage().objects, 3u);
    // A clean close after another remove: the same.
    ASSERT_TRUE(store->Remove("g2", listed["g2"].location).ok());
  }
  auto store = Open();
  ASSERT_TRUE(store);
  auto listed = Listed(*store);
  EXPECT_EQ(listed.size(), 2u);
  EXPECT_TRUE(listed.count("g0") && listed.count("g4"));
  ExpectReadable(*store, {listed["g0"], listed["g4"]});
}

// A copy replaced by a later write never comes back, not even once the later one is removed;
// and the later write wins even with a lower generation (the index's rule, which recovery keeps).
TEST_P(DiskStoreTest, ReplacedCopiesNeverComeBack) {
  const std::string crash = InChildThenCrash(Options(), [&](DiskStore& store) -> std::string {
    if (WriteAll(store, "k", {65536, 65536, 65536, 65536}).size() != 4) return "write gen 1";
    if (WriteAll(store, "k", {8192, 8192}, 2).size() != 2) return "write k0, k1 gen 2";
    if (!store.Remove("k1").ok()) return "remove k1";  // its gen 1 must not come back either
    const auto high_value = ValueFor("k2", 5, 3000), low_value = ValueFor("k2", 3, 5000);
    ObjectWrite high{"k2", 5, high_value, {}};
    ObjectWrite low{"k2", 3, low_value, {}};
    if (!store.Write(std::span(&high, 1))[0].ok() || !store.Write(std::span(&low, 1))[0].ok()) return "k2";
    if (store.Lookup("k2")->gen != 3) return "the index did not take the later write";
    return "";
  });
  ASSERT_EQ(crash, "");
  for (int open = 0; open < 2; ++open) {  // a crash, then a clean close
    auto store = Open();
    ASSERT_TRUE(store);
    auto listed = Listed(*store);
    ASSERT_EQ(listed.size(), 3u) << "k0, k2, k3";
    EXPECT_FALSE(listed.count("k1")) << "neither the removed gen 2 nor the replaced gen 1";
    EXPECT_EQ(listed["k0"].gen, 2u);
    EXPECT_EQ(listed["k0"].size, 8192u);
    EXPECT_EQ(listed["k2"].gen, 3u);
    EXPECT_EQ(listed["k3"].gen, 1u);
    ExpectReadable(*store, {listed["k0"], listed["k2"], listed["k3"]});
  }
  // Removing the winner leaves nothing: the copies it replaced do not step in.
  {
    auto store = Open();
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->Remove("k0").ok());
    ASSERT_TRUE(store->Remove("k2").ok());
  }
  auto store = Open();
  ASSERT_TRUE(store);
  auto listed = Listed(*store);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed.count("k3"));
}

// Remove, then the same key written again: only the new copy is recovered, and a remove naming
// the old location does not touch it.
TEST_P(DiskStoreTest, RemoveThenWriteAgainKeepsOnlyTheNewCopy) {
  const std::string crash = InChildThenCrash(Options(), [&](DiskStore& store) -> std::string {
    auto first = WriteAll(store, "n", {70000, 70000, 70000});
    if (first.size() != 3) return "write gen 1";
    if (!store.Remove("n1", first[1].location).ok()) return "remove";
    auto again = WriteAll(store, "n", {20000, 20000}, 2);  // n0 replaced, n1 back
    if (again.size() != 2 || again[1].location == first[1].location) return "write gen 2";
    if (store.Remove("n1", first[1].location).code() != ErrorCode::OBJECT_NOT_FOUND) {
      return "a remove of the old location touched the new copy";
    }
    return "";
  });
  ASSERT_EQ(crash, "");
  auto store = Open();
  ASSERT_TRUE(store);
  auto listed = Listed(*store);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed["n0"].gen, 2u);
  EXPECT_EQ(listed["n1"].gen, 2u);
  EXPECT_EQ(listed["n1"].size, 20000u);
  EXPECT_EQ(listed["n2"].gen, 1u);
  ExpectReadable(*store, {listed["n0"], listed["n1"], listed["n2"]});
}

// Remove returns while a read still uses the copy (its unit cannot be deleted yet); a crash
// before that read ends must not bring the copy back.
TEST_P(DiskStoreTest, RemoveDuringAReadIsDurableBeforeTheReadEnds) {
  DiskStoreOptions o = Options();
  auto gate = std::make_shared<ReadGate>();
  o.test_hook_after_pin = [gate] { gate->Arrive(); };  // the child's only read stops here
  const std::string crash = InChildThenCrash(o, [&](DiskStore& store) -> std::string {
    // Its own bucket, so that the remove leaves it without live copies but pinned.
    if (WriteAll(store, "p", {300000}).size() != 1 || WriteAll(store, "q", {4096}).size() != 1) return "write";
    auto buffer = std::make_shared<AlignedBuffer>(DiskStore::ReadBufferSize(300000));
    std::thread reader([&store, buffer] {
      ReadRequest r{"p0", 0, buffer->span()};
      (void)store.Read(std::span(&r, 1));
    });
    reader.detach();  // still pinned in the read when the process dies
    gate->WaitArrived();
    if (!store.Remove("p0").ok()) return "remove";
    if (store.Usage().reclaiming == 0) return "the read did not pin the copy";
    return "";
  });
  ASSERT_EQ(crash, "");
  auto store = Open();
  ASSERT_TRUE(store);
  auto listed = Listed(*store);
  EXPECT_FALSE(listed.count("p0"));
  ASSERT_TRUE(listed.count("q0"));
  ExpectReadable(*store, {listed["q0"]});
}

TEST_P(DiskStoreTest, RemovingEveryCopyDeletesTheirFiles) {
  auto count_files = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.path())) {
      const std::string name = e.path().filename().string();
      n += e.is_regular_file() && (name.ends_with(".data") || name.ends_with(".meta") || name.ends_with(".obj")) &&
           name != "offset.data";
    }
    return n;
  };
  std::vector<std::vector<std::byte>> values;
  {
    auto store = Open();
    ASSERT_TRUE(store);
    auto objects = WriteAll(*store, "w", {65536, 4096, 8192});  // one bucket, three files or records
    ASSERT_EQ(objects.size(), 3u);
    if (GetParam().backend != DiskBackend::kOffset) {
      EXPECT_GT(count_files(), 0u);
    }
    for (const auto& o : objects) values.push_back(ValueFor(o.key, 1, o.size));
    for (const auto& o : objects) ASSERT_TRUE(store->Remove(o.key, o.location).ok()) << o.key;
    EXPECT_EQ(count_files(), 0u) << "the bucket's files (or each key's file) are deleted";
    EXPECT_EQ(store->Usage().files, 0u);
    EXPECT_EQ(store->Usage().used, 0u);
    if (GetParam().backend == DiskBackend::kOffset) {
      for (const auto& v : values) {  // the value bytes stay, the header block before them is zeros
        auto at = FindValue(dir_.path(), v);
        ASSERT_TRUE(at);
        std::ifstream in(at->path, std::ios::binary);
        in.seekg(static_cast<std::streamoff>(at->offset - 4096));
        std::vector<char> header(4096);
        in.read(header.data(), header.size());
        EXPECT_TRUE(std::all_of(header.begin(), header.end(), [](char c) { return c == 0; }));
      }
    }
  }
  std::filesystem::remove(dir_.path() + "/offset.index");  // make the offset backend scan its file
  auto store = Open();
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->ListObjects().empty());
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(count_files(), 0u);
}


INSTANTIATE_TEST_SUITE_P(
    Disk, DiskStoreTest,
    ::testing::Values(StoreParam{DiskBackend::kBucket, IoMode::kUring, true},
                      StoreParam{DiskBackend::kBucket, IoMode::kPosix, true},
                      StoreParam{DiskBackend::kFilePerKey, IoMode::kUring, true},
                      StoreParam{DiskBackend::kFilePerKey, IoMode::kPosix, true},
                      StoreParam{DiskBackend::kOffset, IoMode::kUring, true},
                      StoreParam{DiskBackend::kOffset, IoMode::kPosix, true},
                      StoreParam{DiskBackend::kBucket, IoMode::kUring, false},
                      StoreParam{DiskBackend::kFilePerKey, IoMode::kPosix, false},
                      StoreParam{DiskBackend::kOffset, IoMode::kUring, false}),
    ParamName);


}  // namespace
}  // namespace granary::disk::store_test
