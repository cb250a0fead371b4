// The SSD tier's loads on the data plane: DISK_READ served by node::DiskReadService from a real
// DiskStore in a temporary directory, through a real DataServer and TcpTransport (and raw
// sockets for hostile bodies). Also built under ASan (dataplane_asan_tests).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "../disk_test_util.h"
#include "common/checksum.h"
#include "node/data_server.h"
#include "node/disk_read_service.h"
#include "raw_conn.h"
#include "transfer/protocol.h"
#include "transfer/tcp_transport.h"

namespace granary {
namespace {

using disk::testing::TempDir;
using disk::testing::ValueFor;
using node::DataServer;
using node::DiskReadService;
using testing::RawConn;
using transfer::DiskReadBody;
using transfer::DiskReadEntry;
using transfer::DiskReadItem;
using transfer::Opcode;
using transfer::RequestHeader;
using transfer::ResponseHeader;

struct Stored {
  std::string key;
  std::vector<std::byte> value;
  disk::StoredObject copy;
};

class DiskReadTest : public ::testing::Test {
 protected:
  void OpenStore(disk::DiskBackend backend = disk::DiskBackend::kBucket,
                 std::function<void()> hook = {}) {
    disk::DiskStoreOptions o;
    o.dir = dir_.path();
    o.backend = backend;
    o.disk_size = 64ull << 20;
    o.test_hook_after_pin = std::move(hook);
    auto store = disk::DiskStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  // Writes `n` objects of assorted sizes (a few bytes to a few hundred KiB).
  void WriteObjects(int n) {
    std::vector<disk::ObjectWrite> writes;
    for (int i = 0; i < n; ++i) {
      Stored s;
      s.key = "obj/" + std::to_string(i);
      s.value = ValueFor(s.key, 1, 1 + (static_cast<size_t>(i) * 7919) % (300 << 10));
      objects_.push_back(std::move(s));
    }
    for (const auto& s : objects_) writes.push_back({s.key, 1, s.value, Checksum(s.value)});
    auto written = store_->Write(writes);
    for (size_t i = 0; i < written.size(); ++i) {
      ASSERT_TRUE(written[i].ok()) << written[i].status().ToString();
      objects_[i].copy = *written[i];
    }
  }
  void StartServer(DiskReadService::Options options = {}) {
    options.on_lost = [this](std::string_view key, uint64_t location) {
      std::lock_guard lock(lost_mu_);
      lost_[std::string(key)] = location;
    };
    reads_ = std::make_unique<DiskReadService>(store_.get(), std::move(options));
    server_ = std::make_unique<DataServer>(segment_.data(), segment_.size(), 42, server_options_);
    server_->SetDiskReads(reads_.get());
    ASSERT_TRUE(server_->Start().ok());
    endpoint_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  // Items reading objects_[i] into fresh buffers (kept in bufs_).
  std::vector<DiskReadItem> ItemsFor(const std::vector<size_t>& which) {
    std::vector<DiskReadItem> items;
    bufs_.assign(which.size(), {});
    for (size_t k = 0; k < which.size(); ++k) {
      const Stored& s = objects_[which[k]];
      bufs_[k].assign(s.value.size(), std::byte{0});
      items.push_back({s.key, s.copy.location, s.copy.checksum, s.value.size(),
                       {std::span<std::byte>(bufs_[k])}});
    }
    return items;
  }

  // A DISK_READ of objects_[i] alone succeeds and brings its exact bytes.
  void ExpectReadsByteExact(size_t i) {
    auto items = ItemsFor({i});
    std::vector<Status> got = tcp_.ReadDisk(endpoint_, items);
    ASSERT_TRUE(got[0].ok()) << got[0].ToString();
    EXPECT_EQ(bufs_[0], objects_[i].value);
  }

  // Adds one object of `size` bytes to objects_.
  void WriteLarge(const std::string& key, size_t size) {
    Stored s;
    s.key = key;
    s.value = ValueFor(key, 1, size);
    std::vector<disk::ObjectWrite> writes = {{s.key, 1, s.value, Checksum(s.value)}};
    auto written = store_->Write(writes);
    ASSERT_EQ(written.size(), 1u);
    ASSERT_TRUE(written[0].ok()) << written[0].status().ToString();
    s.copy = *written[0];
    objects_.push_back(std::move(s));
  }

  DataServer::Options server_options_ = [] {
    DataServer::Options so;
    so.idle_timeout_ms = 5000;
    return so;
  }();
  TempDir dir_;
  std::unique_ptr<disk::DiskStore> store_;
  std::vector<Stored> objects_;
  std::vector<uint8_t> segment_ = std::vector<uint8_t>(1 << 16);
  std::unique_ptr<DiskReadService> reads_;
  std::unique_ptr<DataServer> server_;
  std::string endpoint_;
  transfer::TcpTransport tcp_;
  std::vector<std::vector<std::byte>> bufs_;
  std::mutex lost_mu_;
  std::map<std::string, uint64_t> lost_;
};

TEST_F(DiskReadTest, ABatchLoadsEveryObjectByteExactAcrossWindows) {
  OpenStore();
  WriteObjects(60);
  DiskReadService::Options o;
  o.window_entries = 7;           // several windows per request...
  o.window_bytes = 256 << 10;     // ...and windows cut by bytes, some holding one large object
  StartServer(o);
  std::vector<size_t> all(objects_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  auto items = ItemsFor(all);
  std::vector<Status> got = tcp_.ReadDisk(endpoint_, items);
  ASSERT_EQ(got.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << objects_[i].key << ": " << got[i].ToString();
    EXPECT_EQ(bufs_[i], objects_[i].value) << objects_[i].key;
  }
  EXPECT_EQ(reads_->stats().objects, objects_.size());
  EXPECT_EQ(server_->stats().disk_bytes_read, reads_->stats().bytes);
  // The connection went back to the pool in sync: a second batch on it works too.
  auto again = ItemsFor({3, 1, 4});
  for (const Status& s : tcp_.ReadDisk(endpoint_, again)) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(bufs_[0], objects_[3].value);
  EXPECT_EQ(tcp_.IdleConnections(endpoint_), 1u);
}

// tcp_transport.h: ReadDisk cuts a batch into as few requests as the protocol's limits allow
// (1,024 entries or 1 MiB of body each).
TEST_F(DiskReadTest, ABatchBeyondTheProtocolsLimitsGoesInSeveralRequests) {
  OpenStore(disk::DiskBackend::kOffset);
  std::vector<disk::ObjectWrite> writes;
  for (int i = 0; i < 1500; ++i) {
    Stored s;
    s.key = "tiny/" + std::to_string(i);
    s.value = ValueFor(s.key, 1, 1 + i % 100);
    objects_.push_back(std::move(s));
  }
  for (const auto& s : objects_) writes.push_back({s.key, 1, s.value, Checksum(s.value)});
  auto written = store_->Write(writes);
  for (size_t i = 0; i < written.size(); ++i) {
    ASSERT_TRUE(written[i].ok()) << written[i].status().ToString();
    objects_[i].copy = *written[i];
  }
  StartServer();
  std::vector<size_t> all(objects_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  auto items = ItemsFor(all);
  const uint64_t before = server_->stats().requests;
  std::vector<Status> got = tcp_.ReadDisk(endpoint_, items);
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << objects_[i].key << ": " << got[i].ToString();
    ASSERT_EQ(bufs_[i], objects_[i].value) << objects_[i].key;
  }
  EXPECT_EQ(server_->stats().requests - before, 2u) << "1500 entries: two requests, no more";
  // Keys long enough that 1 MiB of body holds fewer than 1,024 of them: cut by bytes.
  std::vector<DiskReadItem> long_keys;
  std::vector<std::vector<std::byte>> long_bufs(300, std::vector<std::byte>(1));
  for (size_t i = 0; i < long_bufs.size(); ++i) {
    long_keys.push_back({std::string(4000, 'k') + std::to_string(i), 3ull << 60, 0, 1,
                         {std::span<std::byte>(long_bufs[i])}});
  }
  const uint64_t before_long = server_->stats().requests;
  for (const Status& s : tcp_.ReadDisk(endpoint_, long_keys)) {
    EXPECT_EQ(s.code(), ErrorCode::OBJECT_NOT_FOUND) << s.ToString();
  }
  EXPECT_EQ(server_->stats().requests - before_long, 2u) << "300 x 4 KiB keys: two bodies";
}

TEST_F(DiskReadTest, AnEntryNamingAnyOtherCopyGetsNoBytesAndTheRestStillLoad) {
  OpenStore();
  WriteObjects(6);
  StartServer();
  auto items = ItemsFor({0, 1, 2, 3, 4, 5});
  items[1].location ^= 1;     // another location
  items[2].checksum ^= 1;     // another version's checksum
  items[3].key = "obj/none";  // a key the disk never held
  // Asked as larger than it is: the node must not pad it out or send what it has.
  bufs_[4].assign(objects_[4].value.size() + 10, std::byte{0x77});
  items[4].size = bufs_[4].size();
  items[4].dst = {std::span<std::byte>(bufs_[4])};
  std::vector<Status> got = tcp_.ReadDisk(endpoint_, items);
  EXPECT_TRUE(got[0].ok());
  EXPECT_EQ(got[1].code(), ErrorCode::OBJECT_NOT_FOUND) << got[1].ToString();
  EXPECT_EQ(got[2].code(), ErrorCode::OBJECT_NOT_FOUND) << got[2].ToString();
  EXPECT_EQ(got[3].code(), ErrorCode::OBJECT_NOT_FOUND) << got[3].ToString();
  EXPECT_EQ(got[4].code(), ErrorCode::OBJECT_NOT_FOUND) << got[4].ToString();
  for (auto b : bufs_[4]) ASSERT_EQ(b, std::byte{0x77}) << "bytes of a refused entry arrived";
  ASSERT_TRUE(got[5].ok());
  EXPECT_EQ(bufs_[5], objects_[5].value);
  // Nothing is reported lost: the store holds every copy it held; the askers were wrong.
  std::lock_guard lock(lost_mu_);
  EXPECT_TRUE(lost_.empty());
  // Every copy is still there: a refusal drops nothing.
  for (const auto& s : objects_) EXPECT_TRUE(store_->Lookup(s.key).has_value()) << s.key;
}

TEST_F(DiskReadTest, ACorruptedCopyIsRefusedDroppedAndReportedLost) {
  OpenStore(disk::DiskBackend::kFilePerKey);
  WriteObjects(4);
  StartServer();
  // Flip a value byte of obj/2's file (file-per-key: the value starts at 4096).
  const auto at = disk::testing::FindValue(dir_.path(), objects_[2].value);
  ASSERT_TRUE(at) << "obj/2's value is not on disk";
  disk::testing::FlipByte(*at, 5);
  auto items = ItemsFor({0, 1, 2, 3});
  std::vector<Status> got = tcp_.ReadDisk(endpoint_, items);
  EXPECT_TRUE(got[0].ok() && got[1].ok() && got[3].ok());
  EXPECT_EQ(got[2].code(), ErrorCode::CHECKSUM_MISMATCH) << got[2].ToString();
  EXPECT_FALSE(store_->Lookup("obj/2").has_value()) << "the corrupted copy stayed in the index";
  std::lock_guard lock(lost_mu_);
  ASSERT_EQ(lost_.count("obj/2"), 1u);
  EXPECT_EQ(lost_["obj/2"], objects_[2].copy.location);
  EXPECT_EQ(reads_->stats().lost, 1u);
}

TEST_F(DiskReadTest, StagingMemoryIsBoundedAcrossConnections) {
  // The first read parks after pinning its files; meanwhile a second needs more staging than
  // the budget has left and must be refused after the bounded wait, not allocate past it.
  std::promise<void> parked;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> calls{0};
  OpenStore(disk::DiskBackend::kBucket, [&] {
    if (calls.fetch_add(1) == 0) {
      parked.set_value();
      released.wait();
    }
  });
  WriteObjects(3);
  DiskReadService::Options o;
  o.staging_budget = disk::DiskStore::ReadBufferSize(objects_[0].value.size()) + 4096;
  o.budget_wait_ms = 200;
  DiskReadService reads(store_.get(), o);
  auto first = std::async(std::launch::async, [&] {
    std::vector<DiskReadService::Entry> e = {{objects_[0].key, objects_[0].copy.location,
                                              objects_[0].copy.checksum, objects_[0].value.size()}};
    ErrorCode code = ErrorCode::INTERNAL_ERROR;
    reads.Serve(e, [&](uint32_t, ErrorCode c, std::span<const std::byte>) {
      code = c;
      return true;
    });
    return code;
  });
  parked.get_future().wait();
  std::vector<DiskReadService::Entry> e = {{objects_[1].key, objects_[1].copy.location,
                                            objects_[1].copy.checksum, objects_[1].value.size()}};
  ErrorCode second = ErrorCode::INTERNAL_ERROR;
  const auto t0 = std::chrono::steady_clock::now();
  reads.Serve(e, [&](uint32_t, ErrorCode c, std::span<const std::byte>) {
    second = c;
    return true;
  });
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(150));
  EXPECT_EQ(second, ErrorCode::NO_AVAILABLE_HANDLE);
  release.set_value();
  EXPECT_EQ(first.get(), ErrorCode::OK);
  // Budget back: the same request now goes through.
  reads.Serve(e, [&](uint32_t, ErrorCode c, std::span<const std::byte>) {
    second = c;
    return true;
  });
  EXPECT_EQ(second, ErrorCode::OK);
}

// disk_read_service.h: an entry the index does not hold as named costs no staging and no I/O
// (its size is the asker's word): with the whole budget taken, made-up entries claiming 1 GiB
// each are answered at once, not after the budget wait.
TEST_F(DiskReadTest, MadeUpEntriesCostNoStaging) {
  std::promise<void> parked;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> calls{0};
  OpenStore(disk::DiskBackend::kBucket, [&] {
    if (calls.fetch_add(1) == 0) {
      parked.set_value();
      released.wait();
    }
  });
  WriteObjects(1);
  DiskReadService::Options o;
  o.staging_budget = disk::DiskStore::ReadBufferSize(objects_[0].value.size());
  o.budget_wait_ms = 3000;
  DiskReadService reads(store_.get(), o);
  auto first = std::async(std::launch::async, [&] {
    std::vector<DiskReadService::Entry> e = {{objects_[0].key, objects_[0].copy.location,
                                              objects_[0].copy.checksum, objects_[0].value.size()}};
    return reads.Serve(e, [](uint32_t, ErrorCode, std::span<const std::byte>) { return true; });
  });
  parked.get_future().wait();  // the whole budget is held now
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) keys.push_back("made-up/" + std::to_string(i));
  std::vector<DiskReadService::Entry> made_up;
  for (const auto& k : keys) made_up.push_back({k, 1ull << 60, 1, transfer::kMaxDiskReadObject});
  std::vector<ErrorCode> codes;
  const auto t0 = std::chrono::steady_clock::now();
  reads.Serve(made_up, [&](uint32_t, ErrorCode c, std::span<const std::byte> bytes) {
    EXPECT_TRUE(bytes.empty());
    codes.push_back(c);
    return true;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500))
      << "made-up entries waited for staging";
  release.set_value();
  EXPECT_TRUE(first.get());
  ASSERT_EQ(codes.size(), made_up.size());
  for (ErrorCode c : codes) EXPECT_EQ(c, ErrorCode::OBJECT_NOT_FOUND);
  EXPECT_EQ(calls.load(), 1) << "the store read for entries it does not hold";
}

TEST_F(DiskReadTest, AnObjectLargerThanTheWholeBudgetIsServedWhenTheNodeIsIdle) {
  OpenStore();
  WriteObjects(1);
  DiskReadService::Options o;
  o.staging_budget = 4096;  // smaller than the object
  o.budget_wait_ms = 100;
  StartServer(o);
  ExpectReadsByteExact(0);
}

// ---- hostile bodies, by hand ----

std::vector<uint8_t> Body(uint32_t count, const std::vector<std::pair<DiskReadEntry, std::string>>& entries) {
  std::vector<uint8_t> out(sizeof(DiskReadBody));
  DiskReadBody head;
  head.count = count;
  std::memcpy(out.data(), &head, sizeof(head));
  for (const auto& [e, key] : entries) {
    const size_t at = out.size();
    out.resize(at + sizeof(e) + key.size());
    std::memcpy(out.data() + at, &e, sizeof(e));
    std::memcpy(out.data() + at + sizeof(e), key.data(), key.size());
  }
  return out;
}

// Sends one DISK_READ with `body` and returns the top response header (nullopt: no answer).
std::optional<ResponseHeader> SendDiskRead(RawConn& conn, const std::vector<uint8_t>& body,
                                           uint64_t token = 0, uint64_t offset = 0) {
  RequestHeader h;
  h.opcode = Opcode::kDiskRead;
  h.request_id = 99;
  h.segment_token = token;
  h.offset = offset;
  h.length = body.size();
  if (!conn.Send(&h, sizeof(h)) || !conn.Send(body.data(), body.size())) return std::nullopt;
  ResponseHeader rh;
  if (!conn.Recv(&rh, sizeof(rh))) return std::nullopt;
  return rh;
}

bool PingWorks(RawConn& conn) {
  RequestHeader h;
  h.opcode = Opcode::kPing;
  h.request_id = 5;
  ResponseHeader rh;
  return conn.Send(&h, sizeof(h)) && conn.Recv(&rh, sizeof(rh)) && rh.status == 0 &&
         rh.request_id == 5 && rh.length == 0;
}

TEST_F(DiskReadTest, MalformedBodiesAreRefusedAndTheConnectionStaysInSync) {
  OpenStore();
  WriteObjects(1);
  StartServer();
  const Stored& s = objects_[0];
  DiskReadEntry good{s.copy.location, s.copy.checksum, s.value.size(),
                     static_cast<uint32_t>(s.key.size()), 0};
  auto with = [&](auto change) {
    DiskReadEntry e = good;
    change(e);
    return e;
  };
  std::vector<std::pair<std::string, std::vector<uint8_t>>> bad = {
      {"empty", {}},
      {"count 0", Body(0, {})},
      {"count over the limit", Body(transfer::kMaxDiskReadEntries + 1, {{good, s.key}})},
      {"count larger than the entries", Body(2, {{good, s.key}})},
      {"key length 0", Body(1, {{with([](auto& e) { e.key_len = 0; }), ""}})},
      {"key length over the limit",
       Body(1, {{with([](auto& e) { e.key_len = transfer::kMaxDiskReadKey + 1; }),
                 std::string(transfer::kMaxDiskReadKey + 1, 'k')}})},
      {"key past the body", Body(1, {{with([](auto& e) { e.key_len = 1000; }), s.key}})},
      {"location 0", Body(1, {{with([](auto& e) { e.location = 0; }), s.key}})},
      {"object over the limit",
       Body(1, {{with([](auto& e) { e.size = transfer::kMaxDiskReadObject + 1; }), s.key}})},
      {"reserved entry field", Body(1, {{with([](auto& e) { e.reserved = 1; }), s.key}})},
  };
  auto trailing = Body(1, {{good, s.key}});
  trailing.push_back(0);
  bad.push_back({"bytes after the last entry", trailing});
  auto reserved_head = Body(1, {{good, s.key}});
  reserved_head[4] = 1;
  bad.push_back({"reserved body field", reserved_head});

  RawConn conn(server_->port());
  ASSERT_TRUE(conn.connected());
  for (const auto& [what, body] : bad) {
    auto rh = SendDiskRead(conn, body);
    ASSERT_TRUE(rh.has_value()) << what;
    EXPECT_EQ(rh->status, static_cast<int32_t>(ErrorCode::INVALID_PARAMS)) << what;
    EXPECT_EQ(rh->length, 0u) << what;
    ASSERT_TRUE(PingWorks(conn)) << "out of sync after: " << what;
  }
  // A segment token or an offset has no meaning here: refused too.
  auto body = Body(1, {{good, s.key}});
  for (auto [token, offset] : {std::pair<uint64_t, uint64_t>{42, 0}, {0, 4096}}) {
    auto rh = SendDiskRead(conn, body, token, offset);
    ASSERT_TRUE(rh.has_value());
    EXPECT_EQ(rh->status, static_cast<int32_t>(ErrorCode::INVALID_PARAMS));
    ASSERT_TRUE(PingWorks(conn));
  }
  // The well-formed one, on the same connection: one entry with the object's bytes.
  auto rh = SendDiskRead(conn, body);
  ASSERT_TRUE(rh.has_value());
  ASSERT_EQ(rh->status, 0);
  ASSERT_EQ(rh->length, 1u);
  ResponseHeader eh;
  ASSERT_TRUE(conn.Recv(&eh, sizeof(eh)));
  ASSERT_EQ(eh.status, 0);
  ASSERT_EQ(eh.length, s.value.size());
  std::vector<std::byte> got(eh.length);
  ASSERT_TRUE(conn.Recv(got.data(), got.size()));
  EXPECT_EQ(got, s.value);
  // A body over the limit is a malformed header: the connection closes before any of it is read.
  RawConn big(server_->port());
  RequestHeader h;
  h.opcode = Opcode::kDiskRead;
  h.length = transfer::kMaxDiskReadBody + 1;
  ASSERT_TRUE(big.Send(&h, sizeof(h)));
  EXPECT_TRUE(big.ClosedByPeer());
}

// ---- deadlines on the disk threads ----

// A DISK_READ body for objects_[i] (in order), then `made_up` entries claiming 1 GiB each.
std::vector<uint8_t> BodyFor(const std::vector<Stored>& objects, const std::vector<size_t>& which,
                             int made_up = 0) {
  std::vector<std::pair<DiskReadEntry, std::string>> entries;
  for (size_t i : which) {
    const Stored& s = objects[i];
    entries.push_back({{s.copy.location, s.copy.checksum, s.value.size(),
                        static_cast<uint32_t>(s.key.size()), 0},
                       s.key});
  }
  for (int i = 0; i < made_up; ++i) {
    const std::string key = "made-up/" + std::to_string(i);
    entries.push_back({{uint64_t{1} << 60, 1, transfer::kMaxDiskReadObject,
                        static_cast<uint32_t>(key.size()), 0},
                       key});
  }
  return Body(static_cast<uint32_t>(entries.size()), entries);
}

// A peer that asks for a large object and never reads: its receive buffer is tiny so the
// server's send blocks at once.
std::unique_ptr<RawConn> StalledReader(uint16_t port, const std::vector<uint8_t>& body) {
  auto conn = std::make_unique<RawConn>(port);
  int small = 4096;
  setsockopt(conn->fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  RequestHeader h;
  h.opcode = Opcode::kDiskRead;
  h.request_id = 7;
  h.length = body.size();
  if (!conn->Send(&h, sizeof(h)) || !conn->Send(body.data(), body.size())) return nullptr;
  return conn;
}

// Claimed sizes are the asker's word: eight made-up 1 GiB entries after a real 16 MiB one must
// not stretch the deadline of a reply the peer never reads (it was 0.3 s + 8 GiB at the minimum
// rate, with a 60 s poll per step); the disk thread is free at 0.3 s + 16 MiB at that rate.
TEST_F(DiskReadTest, AReplyThePeerNeverReadsIsCutAtTheRequestDeadline) {
  OpenStore();
  WriteLarge("large", 16 << 20);
  WriteLarge("small", 4096);
  server_options_.disk_threads = 1;
  server_options_.idle_timeout_ms = 60000;
  server_options_.request_timeout_ms = 300;
  server_options_.min_transfer_rate = 16 << 20;  // 16 MiB: +1 s
  StartServer();
  const auto start = std::chrono::steady_clock::now();
  auto stalled = StalledReader(server_->port(), BodyFor(objects_, {0}, 8));
  ASSERT_NE(stalled, nullptr);
  // Bounded wait for the server to give up on it (closed: no connection left open).
  bool dropped = false;
  for (int i = 0; i < 100 && !dropped; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    dropped = server_->stats().open_connections == 0;
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(dropped) << "the stalled reply still holds its connection after " << waited << " s";
  EXPECT_GE(waited, 1.0) << "cut before its deadline";
  EXPECT_LT(waited, 3.0) << "cut late: the claimed sizes stretched the deadline?";
  EXPECT_GE(server_->stats().timeouts, 1u);
  // The only disk thread is free again: a client is served byte-exact.
  ExpectReadsByteExact(1);
}

// With the one disk thread held by a stalled reply, requests queued behind it pass their 0.4 s
// deadline before they start: each is answered RPC_TIMEOUT (and closed) near that deadline, never
// served late, and the node serves again once the thread is free.
TEST_F(DiskReadTest, DiskRequestsQueuedPastTheirDeadlineAreAnsweredRpcTimeout) {
  OpenStore();
  WriteLarge("large", 16 << 20);
  WriteLarge("small", 4096);
  server_options_.disk_threads = 1;
  server_options_.request_timeout_ms = 400;
  server_options_.min_transfer_rate = 8 << 20;  // the stalled reply holds the thread ~2.4 s
  StartServer();
  auto stalled = StalledReader(server_->port(), BodyFor(objects_, {0}));
  ASSERT_NE(stalled, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // it holds the disk thread
  constexpr int kQueued = 8;
  std::vector<std::unique_ptr<RawConn>> queued;
  const auto start = std::chrono::steady_clock::now();
  const auto body = BodyFor(objects_, {1});
  for (int i = 0; i < kQueued; ++i) {
    queued.push_back(std::make_unique<RawConn>(server_->port()));
    RequestHeader h;
    h.opcode = Opcode::kDiskRead;
    h.request_id = 100 + i;
    h.length = body.size();
    ASSERT_TRUE(queued.back()->Send(&h, sizeof(h)));
    ASSERT_TRUE(queued.back()->Send(body.data(), body.size()));
  }
  for (int i = 0; i < kQueued; ++i) {
    auto rh = queued[i]->RecvResponse();  // RawConn gives up after 5 s
    ASSERT_TRUE(rh.has_value()) << "queued request " << i << " got no answer";
    EXPECT_EQ(rh->status, static_cast<int32_t>(ErrorCode::RPC_TIMEOUT)) << "request " << i;
    EXPECT_EQ(rh->request_id, 100u + i);
    EXPECT_EQ(rh->length, 0u);
    EXPECT_TRUE(queued[i]->ClosedByPeer());
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.35);
  EXPECT_LT(waited, 1.5) << "answered long after the 0.4 s deadline";
  EXPECT_GE(server_->stats().timeouts, uint64_t{kQueued});
  stalled.reset();  // frees the disk thread
  ExpectReadsByteExact(1);
}

TEST_F(DiskReadTest, RandomBodiesAreAnsweredOrRefusedNeverCrashTheNode) {
  OpenStore();
  WriteObjects(3);
  StartServer();
  std::mt19937_64 rng(20261124);
  RawConn conn(server_->port());
  ASSERT_TRUE(conn.connected());
  int refused = 0, served = 0;
  for (int round = 0; round < 300; ++round) {
    std::vector<uint8_t> body;
    if (round % 3 == 0) {
      body.resize(rng() % 200);
      for (auto& b : body) b = static_cast<uint8_t>(rng());
    } else {
      // A plausible body with one field scrambled.
      const Stored& s = objects_[rng() % objects_.size()];
      DiskReadEntry e{s.copy.location, s.copy.checksum, s.value.size(),
                      static_cast<uint32_t>(s.key.size()), 0};
      auto* raw = reinterpret_cast<uint8_t*>(&e);
      raw[rng() % sizeof(e)] = static_cast<uint8_t>(rng());
      body = Body(1, {{e, s.key}});
    }
    auto rh = SendDiskRead(conn, body);
    ASSERT_TRUE(rh.has_value()) << "round " << round;
    if (rh->status != 0) {
      ASSERT_EQ(rh->length, 0u);
      ++refused;
      continue;
    }
    ++served;
    for (uint64_t i = 0; i < rh->length; ++i) {
      ResponseHeader eh;
      ASSERT_TRUE(conn.Recv(&eh, sizeof(eh)));
      ASSERT_EQ(eh.request_id, i);
      if (eh.status != 0) {
        ASSERT_EQ(eh.length, 0u);
        continue;
      }
      std::vector<uint8_t> bytes(eh.length);
      ASSERT_TRUE(conn.Recv(bytes.data(), bytes.size()));
    }
  }
  EXPECT_GT(refused, 50);
  EXPECT_GT(served, 50);
  EXPECT_TRUE(PingWorks(conn));
}

TEST(DiskReadNoTier, ANodeWithoutADiskTierRefusesDiskReads) {
  std::vector<uint8_t> segment(1 << 16);
  DataServer server(segment.data(), segment.size(), 42);
  ASSERT_TRUE(server.Start().ok());
  transfer::TcpTransport tcp;
  std::vector<std::byte> buf(10);
  std::vector<DiskReadItem> items = {{"k", 1ull << 60, 0, buf.size(), {std::span<std::byte>(buf)}}};
  auto got = tcp.ReadDisk("127.0.0.1:" + std::to_string(server.port()), items);
  EXPECT_EQ(got[0].code(), ErrorCode::OBJECT_NOT_FOUND) << got[0].ToString();
  EXPECT_TRUE(tcp.Ping("127.0.0.1:" + std::to_string(server.port())).ok());
}

}  // namespace
}  // namespace granary
