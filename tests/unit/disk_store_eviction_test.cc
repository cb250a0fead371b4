// The disk tier's store under pressure, for every backend x I/O path (the fixture and its
// instantiation: disk_store_fixture.h, disk_store_test.cc): the byte budget, both eviction
// policies, corrupted / truncated / deleted files read as misses, remove and eviction while a
// read is in flight, hostile requests, and everyone at once.
#include "disk_store_fixture.h"

namespace granary::disk::store_test {
namespace {

TEST_P(DiskStoreTest, ByteBudgetRefusesWhatDoesNotFitThenEvictionMakesRoom) {
  DiskStoreOptions o = Options();
  o.disk_size = 2ull << 20;
  auto store = Open(o);
  ASSERT_TRUE(store);
  std::vector<std::string> keys;
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < 12; ++i) {
    keys.push_back("budget" + std::to_string(i));
    values.push_back(ValueFor(keys.back(), 1, 256 << 10));
  }
  std::vector<ObjectWrite> batch;
  for (int i = 0; i < 12; ++i) batch.push_back(ObjectWrite{keys[i], 1, values[i], {}});
  auto results = store->Write(batch);
  std::vector<StoredObject> stored;
  size_t refused = 0;
  for (auto& r : results) {
    if (r.ok()) {
      stored.push_back(*r);
    } else {
      EXPECT_EQ(r.code(), ErrorCode::NO_AVAILABLE_HANDLE) << r.status().ToString();
      ++refused;
    }
  }
  EXPECT_GE(stored.size(), 4u);
  EXPECT_GE(refused, 1u) << "12 x 256 KiB cannot fit a 2 MiB budget";
  EXPECT_LE(store->Usage().used, store->Usage().capacity);
  ExpectReadable(*store, stored);

  auto victims = store->SelectVictims(600 << 10);
  EXPECT_FALSE(victims.empty());
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  auto retry = store->Write(std::span(&batch.back(), 1));
  EXPECT_TRUE(retry[0].ok()) << retry[0].status().ToString();
}

TEST_P(DiskStoreTest, FifoEvictsOldestFilesFirst) {
  DiskStoreOptions o = Options();
  o.bucket_max_keys = 2;
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto old_ones = WriteAll(*store, "old", {65536, 65536});
  auto mid = WriteAll(*store, "mid", {65536, 65536});
  auto young = WriteAll(*store, "young", {65536, 65536});
  ExpectReadable(*store, old_ones);  // reading does not matter to fifo
  const uint64_t used = store->Usage().used;
  auto victims = store->SelectVictims(1);
  ASSERT_FALSE(victims.empty());
  for (const auto& v : victims) EXPECT_EQ(v.key.rfind("old", 0), 0u) << v.key;
  // Phase one dropped them from the index but did not touch the disk.
  EXPECT_EQ(store->Usage().used, used);
  EXPECT_GT(store->Usage().reclaiming, 0u);
  for (const auto& v : victims) {
    EXPECT_FALSE(store->Lookup(v.key));
    EXPECT_EQ(ReadOne(*store, v.key).status.code(), ErrorCode::OBJECT_NOT_FOUND);
  }
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  EXPECT_LT(store->Usage().used, used);
  EXPECT_EQ(store->Usage().reclaiming, 0u);
  ExpectReadable(*store, mid);
  ExpectReadable(*store, young);
  // Evicting everything leaves an empty store.
  victims = store->SelectVictims(UINT64_MAX);
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Usage().objects, 0u);
}

// A prefix cache writes far more than it rereads: a bucket just written must not go before one
// read long ago (the rule "never read first" did exactly that).
TEST_P(DiskStoreTest, LruCountsAWriteAsAUse) {
  DiskStoreOptions o = Options();
  o.bucket_max_keys = 1;
  o.eviction = EvictionPolicy::kLru;
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto a = WriteAll(*store, "A", {65536});
  ExpectReadable(*store, a);
  auto b = WriteAll(*store, "B", {65536});
  auto first = store->SelectVictims(1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].key, "A0") << "read before B was written: the least recently used";
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
}

TEST_P(DiskStoreTest, LruEvictsLeastRecentlyWrittenOrRead) {
  DiskStoreOptions o = Options();
  o.bucket_max_keys = 1;
  o.eviction = EvictionPolicy::kLru;
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto a = WriteAll(*store, "A", {65536});
  auto b = WriteAll(*store, "B", {65536});
  auto c = WriteAll(*store, "C", {65536});
  ExpectReadable(*store, a);
  ExpectReadable(*store, c);
  auto first = store->SelectVictims(1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].key, "B0") << "written after A but A and C were read since";
  auto second = store->SelectVictims(1);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].key, "A0") << "then the least recently read";
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  ExpectReadable(*store, c);
}

TEST_P(DiskStoreTest, CorruptedByteReadsAsMissNeverWrongBytes) {
  auto store = Open();
  ASSERT_TRUE(store);
  auto objects = WriteAll(*store, "c", {200000, 65536});
  auto value = ValueFor("c0", 1, 200000);
  auto at = FindValue(dir_.path(), value);
  ASSERT_TRUE(at) << "value bytes not found on disk";
  testing::FlipByte(*at, 150000);
  AlignedBuffer buffer(DiskStore::ReadBufferSize(200000));
  ReadRequest r{"c0", objects[0].location, buffer.span()};
  auto result = store->Read(std::span(&r, 1))[0];
  EXPECT_EQ(result.status.code(), ErrorCode::CHECKSUM_MISMATCH) << result.status.ToString();
  EXPECT_FALSE(store->Lookup("c0")) << "a corrupt copy is dropped from the index";
  EXPECT_EQ(ReadOne(*store, "c0").status.code(), ErrorCode::OBJECT_NOT_FOUND);
  ExpectReadable(*store, {objects[1]});
}

TEST_P(DiskStoreTest, TruncatedFileReadsAsMiss) {
  auto store = Open();
  ASSERT_TRUE(store);
  auto objects = WriteAll(*store, "t", {300000});
  auto at = FindValue(dir_.path(), ValueFor("t0", 1, 300000));
  ASSERT_TRUE(at);
  std::filesystem::resize_file(at->path, at->offset + 65536);
  auto result = ReadOne(*store, "t0", objects[0].location);
  EXPECT_EQ(result.status.code(), ErrorCode::INVALID_READ) << result.status.ToString();
  EXPECT_FALSE(store->Lookup("t0"));
}

TEST_P(DiskStoreTest, DeletedFileReadsAsMiss) {
  if (GetParam().backend == DiskBackend::kOffset) {
    // Its one file stays open while the store runs, so deleting it shows at the next open: an
    // empty store on a fresh file, never the old objects.
    {
      auto store = Open();
      ASSERT_TRUE(store);
      WriteAll(*store, "d", {65536});
    }
    std::filesystem::remove(dir_.path() + "/offset.data");
    auto store = Open();
    ASSERT_TRUE(store);
    EXPECT_TRUE(store->ListObjects().empty());
    EXPECT_EQ(store->Usage().used, 0u);
    EXPECT_EQ(ReadOne(*store, "d0").status.code(), ErrorCode::OBJECT_NOT_FOUND);
    ExpectReadable(*store, WriteAll(*store, "e", {65536}));
    return;
  }
  auto store = Open();
  ASSERT_TRUE(store);
  auto objects = WriteAll(*store, "d", {65536, 65536});  // one bucket, or two files
  auto at = FindValue(dir_.path(), ValueFor("d0", 1, 65536));
  ASSERT_TRUE(at);
  std::filesystem::remove(at->path);
  auto result = ReadOne(*store, "d0");
  EXPECT_EQ(result.status.code(), ErrorCode::OBJECT_NOT_FOUND) << result.status.ToString();
  EXPECT_FALSE(store->Lookup("d0"));
  if (GetParam().backend == DiskBackend::kBucket) {
    EXPECT_FALSE(store->Lookup("d1")) << "the bucket's other objects went with its file";
    EXPECT_EQ(store->Usage().used, 0u) << "the vanished file's charge is released";
    EXPECT_EQ(store->Usage().files, 0u);
  } else {
    ExpectReadable(*store, {objects[1]});
    EXPECT_EQ(store->Usage().objects, 1u);
    EXPECT_EQ(store->Usage().files, 1u);
  }
}

TEST_P(DiskStoreTest, RemoveWhileReadInFlightWaitsForTheRead) {
  std::unique_ptr<DiskStore> store;  // declared first: it outlives the held read
  HeldRead held(500000);
  store = OpenHeld(Options(), held);
  ASSERT_TRUE(store);
  auto objects = WriteAll(*store, "rw", {500000});
  const uint64_t used = store->Usage().used;
  held.Start(*store, "rw0", 0);
  ASSERT_TRUE(store->Remove("rw0").ok());
  EXPECT_FALSE(store->Lookup("rw0"));
  EXPECT_EQ(store->Usage().used, used) << "the file outlives the remove while a read uses it";
  EXPECT_EQ(store->Usage().reclaiming, used);
  held.Finish();
  ASSERT_TRUE(held.result.status.ok()) << held.result.status.ToString();
  EXPECT_TRUE(held.GotBytesOf("rw0", 1));
  EXPECT_EQ(store->Usage().used, 0u) << "the last reader deleted it";
}

TEST_P(DiskStoreTest, EvictionWaitsBoundedForReadsInFlight) {
  std::unique_ptr<DiskStore> store;  // declared first: it outlives the held read
  HeldRead held(300000);
  store = OpenHeld(Options(), held);
  ASSERT_TRUE(store);
  auto objects = WriteAll(*store, "ev", {300000});
  held.Start(*store, "ev0", objects[0].location);
  auto victims = store->SelectVictims(1);
  ASSERT_EQ(victims.size(), 1u);
  auto start = std::chrono::steady_clock::now();
  Status st = store->ReclaimVictims(std::chrono::milliseconds(100));
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(st.code(), ErrorCode::OBJECT_HAS_LEASE) << st.ToString();
  EXPECT_GE(waited, std::chrono::milliseconds(90));
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_GT(store->Usage().used, 0u);
  held.Finish();
  ASSERT_TRUE(held.result.status.ok()) << held.result.status.ToString();
  EXPECT_TRUE(held.GotBytesOf("ev0", 1));
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(1000)).ok());
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_P(DiskStoreTest, HostileRequestsGetClearErrors) {
  DiskStoreOptions o = Options();
  o.max_object_size = 1 << 20;
  auto store = Open(o);
  ASSERT_TRUE(store);
  auto objects = WriteAll(*store, "h", {65536});
  const uint64_t good = objects[0].location;
  // Locations that cannot be this store's: other tags, all ones, a huge offset or id.
  const uint64_t tag = good & 0xF000000000000000ull;
  const std::vector<uint64_t> bad_locations = {0xFFFFFFFFFFFFFFFFull, 0xF000000000000001ull, 1,
                                               (tag ^ 0x7000000000000000ull) | 5, tag | 0x0FFFFFFFFFFFFFFFull};
  for (uint64_t bad : bad_locations) {
    auto r = ReadOne(*store, "h0", bad);
    EXPECT_TRUE(r.status.code() == ErrorCode::INVALID_PARAMS || r.status.code() == ErrorCode::OBJECT_NOT_FOUND)
        << std::hex << bad << ": " << r.status.ToString();
    EXPECT_FALSE(r.status.ok());
    Status rm = store->Remove("h0", bad);
    EXPECT_FALSE(rm.ok());
  }
  EXPECT_EQ(ReadOne(*store, "h0", 0xFFFFFFFFFFFFFFFFull).status.code(), ErrorCode::INVALID_PARAMS);
  // Bad keys.
  EXPECT_EQ(ReadOne(*store, "").status.code(), ErrorCode::INVALID_KEY);
  EXPECT_EQ(ReadOne(*store, std::string(5000, 'k')).status.code(), ErrorCode::INVALID_KEY);
  // Buffers: unaligned, too small.
  AlignedBuffer buffer(2 << 20);
  ReadRequest unaligned{"h0", 0, buffer.span().subspan(1, 1 << 20)};
  EXPECT_EQ(store->Read(std::span(&unaligned, 1))[0].status.code(), ErrorCode::INVALID_PARAMS);
  ReadRequest small{"h0", 0, buffer.span().subspan(0, 4096)};
  EXPECT_EQ(store->Read(std::span(&small, 1))[0].status.code(), ErrorCode::BUFFER_OVERFLOW);
  // Writes: too big, wrong checksum, bad keys; the good one in the same batch goes through.
  auto big = ValueFor("big", 1, (1 << 20) + 1);
  auto fine = ValueFor("fine", 1, 4096);
  std::vector<ObjectWrite> batch = {
      {"big", 1, big, {}},
      {"sum", 1, fine, Checksum(fine) + 1},
      {"", 1, fine, {}},
      {std::string_view(reinterpret_cast<const char*>(big.data()), 4097), 1, fine, {}},
      {"fine", 1, fine, Checksum(fine)},
  };
  auto results = store->Write(batch);
  EXPECT_EQ(results[0].code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(results[1].code(), ErrorCode::CHECKSUM_MISMATCH);
  EXPECT_EQ(results[2].code(), ErrorCode::INVALID_KEY);
  EXPECT_EQ(results[3].code(), ErrorCode::INVALID_KEY);
  EXPECT_TRUE(results[4].ok()) << results[4].status().ToString();
  // The store still serves what it had.
  ExpectReadable(*store, objects);
}

TEST_P(DiskStoreTest, ConcurrentWritersAndReaders) {
  auto store = Open();
  ASSERT_TRUE(store);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        std::string prefix = "t" + std::to_string(t) + "r" + std::to_string(round) + "_";
        std::vector<std::string> keys;
        std::vector<std::vector<std::byte>> values;
        for (int i = 0; i < 6; ++i) {
          keys.push_back(prefix + std::to_string(i));
          values.push_back(ValueFor(keys.back(), 1, 20000 + 5000 * i));
        }
        std::vector<ObjectWrite> batch;
        for (int i = 0; i < 6; ++i) batch.push_back(ObjectWrite{keys[i], 1, values[i], {}});
        for (auto& r : store->Write(batch)) failures += !r.ok();
        std::vector<AlignedBuffer> buffers;
        std::vector<ReadRequest> reads;
        for (int i = 0; i < 6; ++i) buffers.emplace_back(DiskStore::ReadBufferSize(values[i].size()));
        for (int i = 0; i < 6; ++i) reads.push_back(ReadRequest{keys[i], 0, buffers[i].span()});
        auto results = store->Read(reads);
        for (int i = 0; i < 6; ++i) {
          if (!results[i].status.ok() || std::memcmp(buffers[i].data(), values[i].data(), values[i].size()) != 0) {
            ++failures;
          }
        }
        if (round % 2) failures += !store->Remove(keys[0]).ok();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store->Usage().objects, 4u * 5 * 6 - 4 * 2);
}

// Writers, readers, removers and a two-phase evictor at once, for a bounded number of rounds: a
// read is either the exact bytes of the generation it reports or a miss, never anything else; at
// the end, evicting everything leaves no bytes charged and no files behind.
TEST_P(DiskStoreTest, EveryoneAtOnceNeverServesWrongBytes) {
  DiskStoreOptions o = Options();
  o.bucket_max_keys = 3;
  o.disk_size = 8ull << 20;
  o.eviction = GetParam().io == IoMode::kUring ? EvictionPolicy::kLru : EvictionPolicy::kFifo;
  auto store = Open(o);
  ASSERT_TRUE(store);
  constexpr int kKeys = 24;
  auto size_of = [](int k, uint64_t gen) { return size_t(4096 * (1 + (k + gen) % 24) + k); };
  std::atomic<bool> writers_done{false};
  std::atomic<int> wrong{0}, reads_ok{0}, writes_ok{0};
  std::vector<std::thread> writers, threads;
  for (int w = 0; w < 2; ++w) {
    writers.emplace_back([&, w] {
      for (uint64_t gen = 1 + w * 1000; gen < 40 + uint64_t(w) * 1000; ++gen) {
        std::vector<std::string> keys;
        std::vector<std::vector<std::byte>> values;
        for (int k = w; k < kKeys; k += 4) {
          keys.push_back("key" + std::to_string(k));
          values.push_back(ValueFor(keys.back(), gen, size_of(k, gen)));
        }
        std::vector<ObjectWrite> batch;
        for (size_t i = 0; i < keys.size(); ++i) batch.push_back(ObjectWrite{keys[i], gen, values[i], {}});
        for (auto& r : store->Write(batch)) {
          if (r.ok()) ++writes_ok;
          else if (r.code() != ErrorCode::NO_AVAILABLE_HANDLE) ++wrong;
        }
      }
    });
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<AlignedBuffer> buffers;
      for (int i = 0; i < 8; ++i) buffers.emplace_back(AlignUp(size_of(kKeys, 24) + 4096 * 24));
      // Until the writers are done and a read has succeeded, at least 60 rounds. The bound is
      // time, not rounds: misses are so cheap that, on a loaded machine, 20,000 rounds of them
      // passed before a slow writer's first batch landed (CI, file_posix).
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      for (int round = 0;
           std::chrono::steady_clock::now() < deadline &&
           (round < 60 || !writers_done || reads_ok.load() == 0);
           ++round) {
        std::vector<std::string> keys;
        std::vector<ReadRequest> reads;
        for (int i = 0; i < 8; ++i) keys.push_back("key" + std::to_string((round * 8 + i + r) % kKeys));
        for (int i = 0; i < 8; ++i) reads.push_back(ReadRequest{keys[i], 0, buffers[i].span()});
        auto results = store->Read(reads);
        for (int i = 0; i < 8; ++i) {
          if (!results[i].status.ok()) {
            if (results[i].status.code() != ErrorCode::OBJECT_NOT_FOUND) ++wrong;
            continue;
          }
          const int k = std::stoi(keys[i].substr(3));
          auto want = ValueFor(keys[i], results[i].gen, size_of(k, results[i].gen));
          if (results[i].size != want.size() || std::memcmp(buffers[i].data(), want.data(), want.size()) != 0) {
            ++wrong;
          } else {
            ++reads_ok;
          }
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (int round = 0; round < 5000 && (round < 60 || !writers_done); ++round) {
      if (round % 3 == 0) (void)store->Remove("key" + std::to_string(round % kKeys));
      if (store->Usage().used > store->Usage().capacity / 2) {
        store->SelectVictims(1 << 20);
        Status st = store->ReclaimVictims(std::chrono::milliseconds(200));
        if (!st.ok() && st.code() != ErrorCode::OBJECT_HAS_LEASE) ++wrong;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (auto& t : writers) t.join();
  writers_done = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(writes_ok.load(), 0);
  EXPECT_GT(reads_ok.load(), 0);
  EXPECT_LE(store->Usage().used, store->Usage().capacity);
  for (const auto& o : store->ListObjects()) {
    EXPECT_EQ(o.size, size_of(std::stoi(o.key.substr(3)), o.gen)) << o.key;
  }
  store->SelectVictims(UINT64_MAX);
  ASSERT_TRUE(store->ReclaimVictims(std::chrono::milliseconds(2000)).ok());
  DiskUsage usage = store->Usage();
  EXPECT_EQ(usage.used, 0u);
  EXPECT_EQ(usage.objects, 0u);
  EXPECT_EQ(usage.files, 0u);
  size_t data_files = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_.path())) {
    const std::string name = e.path().filename().string();
    if (name == "tombstones") {  // the bucket backend's log: whole records only
      EXPECT_EQ(std::filesystem::file_size(e.path()) % 48, 0u);
      continue;
    }
    if (e.is_regular_file() && name != "FORMAT" && name != "LOCK" && name != "offset.data") ++data_files;
  }
  EXPECT_EQ(data_files, 0u) << "every bucket and object file is deleted";
}


}  // namespace
}  // namespace granary::disk::store_test
