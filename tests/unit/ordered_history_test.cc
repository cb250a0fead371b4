// The master's ordered history (Master core v2, part 1): many threads mutate one state at once;
// the operations it numbered, replayed in order into a fresh state, or a snapshot taken mid-run
// plus the operations after it, must give a state with the same digest (objects, replicas,
// allocator free lists, queues, ghost, clients, deferred frees, counters).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "master/policy/evictor.h"
#include "master/history/history_file.h"
#include "master/state/master_state.h"
#include "master/state/state_codec.h"

namespace granary::master {
namespace {

constexpr uint64_t kKiB = 1024;

MasterPolicy Policy(EvictionPolicy eviction) {
  MasterPolicy p;
  p.eviction_policy = eviction;
  p.lease_ttl_ms = 50;
  p.mount_quarantine_ms = 20;
  p.write_quarantine_ms = 40;
  p.client_ttl_ms = 200;
  p.put_discard_timeout_ms = 30;
  p.put_release_timeout_ms = 60;
  p.eviction_high_watermark = 0.8;
  p.reservation_ttl_ms = 50;
  p.reservation_max_bytes = 256 * 1024;
  p.shard_count = 4;  // many keys per shard: iteration order within a shard matters
  return p;
}

// Each mount has its capability key (32 bytes, as a node draws them), which the snapshots and
// the replayed mounts must carry for a standby to sign what the leader signed.
SegmentSpec Spec(const std::string& name, uint64_t size, uint64_t token, bool fresh) {
  std::string key(32, '\0');
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<char>((token >> (i % 8)) + i);
  return {name, size, "127.0.0.1:1", "granary-" + name, "host/boot", token, fresh, key};
}

struct RecordedRun {
  std::string initial;                 // snapshot before the first operation
  std::vector<Operation> log;          // every operation, in sequence order
  std::string mid_snapshot;            // taken while the threads ran
  MasterState::Fingerprint final_state;
  uint64_t promotions_started = 0;     // PromoteStart keys that got an allocation
  uint64_t most_explicit_persistence = 0;  // committed versions with their own, at most at once
};

// Drives `state` from several threads at once: puts (some failing mid-way), upserts, gets,
// removes, regex removals, evictions, sweeps, mounts and unmounts, pings and expiries, and the
// SSD tier's demotions, registrations, drops, disk garbage acknowledgements and promotions.
uint64_t DiskOf(const std::string& node) { return 0xD15C00 + (node.back() - '0'); }  // node-N

void DriveConcurrently(MasterState& state, ManualClock& clock, int threads, int rounds,
                       RecordedRun& run) {
  run.initial = state.EncodeSnapshot();
  state.AddObserver([&run, &state](const Operation& op, const OpResult& result) {
    run.log.push_back(op);
    run.most_explicit_persistence =
        std::max(run.most_explicit_persistence, state.explicit_persistence_count());
    if (const auto* promoted = std::get_if<std::vector<PromoteStartKeyResult>>(&result)) {
      for (const auto& r : *promoted) run.promotions_started += r.status.ok();
    }
  });
  for (int s = 0; s < 3; ++s) {
    const std::string node = "node-" + std::to_string(s);
    EXPECT_TRUE(state.Mount({node, Spec("seg-" + std::to_string(s), 2048 * kKiB, 100 + s, true)})
                    .status.ok());
    state.DiskRegister({node, {}, DiskOf(node), true});  // its disk may offload
  }
  Evictor evictor(&state);
  std::atomic<uint64_t> promote_rounds[3] = {};  // each node's offload rounds count up
  std::atomic<int> done{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      const std::string client = "client-" + std::to_string(t);
      for (int i = 0; i < rounds; ++i) {
        if (t == 1 && i == rounds / 2) run.mid_snapshot = state.EncodeSnapshot();
        const int pick = static_cast<int>(rng() % 100);
        std::vector<std::string> keys;
        const int n = 1 + static_cast<int>(rng() % 6);
        for (int k = 0; k < n; ++k) keys.push_back("key/" + std::to_string(rng() % 300));
        if (pick < 40 && rng() % 8 == 0) {
          // One-round-trip puts: reserve, then commit some (a few by the wrong client or with
          // the wrong size), release some, and leave the rest to expire.
          const uint64_t size = (1 + rng() % 64) * kKiB;
          ReserveResult reserved = state.Reserve({client, size, static_cast<uint32_t>(n), {}});
          std::vector<std::string> commit_keys;
          std::vector<uint64_t> names, sizes, sums, spare, segments, offsets, spare_segments,
              spare_offsets;
          for (size_t k = 0; k < reserved.granted.size(); ++k) {
            const int fate = static_cast<int>(rng() % 12);
            if (fate < 8) {
              commit_keys.push_back(keys[k]);
              names.push_back(reserved.granted[k].gen);
              sizes.push_back(rng() % 10 == 0 ? size + 1 : size);
              sums.push_back(rng());
              segments.push_back(reserved.granted[k].extent.segment_id);
              offsets.push_back(reserved.granted[k].extent.offset + (rng() % 20 == 0 ? 64 : 0));
            } else if (fate < 11) {
              spare.push_back(reserved.granted[k].gen);
              spare_segments.push_back(reserved.granted[k].extent.segment_id);
              // Now and then a wrong place: the release must then free nothing.
              spare_offsets.push_back(reserved.granted[k].extent.offset + (rng() % 20 == 0 ? 64 : 0));
            }
          }
          if (!commit_keys.empty()) {
            PlacementConfig config;
            config.with_soft_pin = rng() % 10 == 0;
            if (rng() % 2 == 0) config.persistence = static_cast<PutPersistence>(rng() % 5);
            state.PutCommit({rng() % 8 == 0 ? std::string("client-x") : client, commit_keys, names,
                             sizes, sums, config, rng() % 4 == 0, segments, offsets});
          }
          if (!spare.empty()) {
            state.ReleaseReservations({client, spare, spare_segments, spare_offsets});
          }
        } else if (pick < 40) {
          std::vector<uint64_t> sizes;
          for (int k = 0; k < n; ++k) sizes.push_back((1 + rng() % 64) * kKiB + rng() % 100);
          PlacementConfig config;
          config.replica_num = 1 + static_cast<uint32_t>(rng() % 2);
          config.with_soft_pin = rng() % 10 == 0;
          // Half the puts choose their own persistence (default, eager, lazy, none, or an
          // unknown value, which PutStart refuses and the replay must refuse alike).
          if (rng() % 2 == 0) config.persistence = static_cast<PutPersistence>(rng() % 5);
          auto started = state.PutStart({client, keys, sizes, config, rng() % 8 == 0});
          std::vector<std::string> ok_keys;
          std::vector<uint64_t> gens, sums;
          for (int k = 0; k < n; ++k) {
            if (!started[k].status.ok()) continue;
            ok_keys.push_back(keys[k]);
            gens.push_back(started[k].put_gen);
            sums.push_back(rng());
          }
          if (ok_keys.empty()) continue;
          const int fate = static_cast<int>(rng() % 10);
          if (fate < 7) {
            state.PutEnd({client, ok_keys, sums, gens});
          } else if (fate < 9) {
            state.PutRevoke({client, ok_keys, gens, fate == 8});
          }  // else: the writer "dies"; the zombie is swept or taken over later
        } else if (pick < 70) {
          state.GetReplicaList({client, keys});
          if (rng() % 4 != 0) state.FinishRead({client, keys});  // some locks just expire
        } else if (pick < 80) {
          state.Remove({keys, rng() % 3 == 0});
        } else if (pick < 84) {
          state.RemoveByRegex({"^key/" + std::to_string(rng() % 3) + "[0-9]$", false});
        } else if (pick < 87) {
          evictor.EvictBytes((1 + rng() % 512) * kKiB);
        } else if (pick < 92) {
          state.Sweep();
          evictor.RunIfAboveWatermark();
        } else if (pick < 95) {
          state.Ping(client);
          state.Ping("node-" + std::to_string(rng() % 3));
          for (const auto& silent : state.SilentClients(clock.NowMs())) state.ExpireClient(silent);
        } else if (pick < 97 && t == 0) {
          // A node goes and comes back: its memory is remounted (quarantined) under a new token.
          const uint64_t s = rng() % 3;
          const std::string name = "seg-" + std::to_string(s);
          if (state.segments().FindByName(name)) state.Unmount({"node-" + std::to_string(s), name});
          state.Mount({"node-" + std::to_string(s), Spec(name, 2048 * kKiB, rng() | 1, false)});
        } else if (pick < 98) {
          // The SSD tier's offload: demotions that end, abort, or stall (swept later).
          const std::string node = "node-" + std::to_string(rng() % 3);
          const uint64_t disk = DiskOf(node);
          if (rng() % 3 != 0) {  // two thirds: promotions need disk-only objects to find
            // Promotions back to memory that are copied, given up, or never reported (the
            // node's next round frees them).
            // Eviction makes room and leaves demoted objects on disk only; the node's own such
            // objects are the likely candidates (the operation re-checks each).
            evictor.EvictBytes((64 + rng() % 256) * kKiB);
            for (size_t s = 0; s < state.shard_count() && keys.size() < 12; ++s) {
              state.ScanShard(s, [&](std::string_view key, const ObjectMeta& meta) {
                if (keys.size() >= 12 || !meta.committed || !meta.committed->replicas.empty()) return;
                for (const auto& d : meta.committed->disk) {
                  if (d.node_id == node) {
                    keys.emplace_back(key);
                    break;
                  }
                }
              });
            }
            const uint64_t round = ++promote_rounds[node.back() - '0'];
            auto started = state.PromoteStart({node, keys, disk, round});
            std::vector<std::string> promoting;
            std::vector<uint64_t> versions;
            std::vector<uint8_t> copied;
            for (size_t k = 0; k < keys.size(); ++k) {
              if (!started[k].status.ok()) continue;
              promoting.push_back(keys[k]);
              versions.push_back(started[k].version_gen);
              copied.push_back(rng() % 4 != 0);
            }
            if (!promoting.empty() && rng() % 3 != 0) {
              state.PromoteEnd({node, round, promoting, versions, copied});
            }
            continue;
          }
          auto started = state.DemoteStart({node, keys, disk});
          std::vector<std::string> demoting;
          std::vector<uint64_t> versions, locations;
          for (int k = 0; k < n; ++k) {
            if (!started[k].status.ok()) continue;
            demoting.push_back(keys[k]);
            versions.push_back(started[k].version_gen);
            locations.push_back(rng());
          }
          if (demoting.empty()) continue;
          const int fate = static_cast<int>(rng() % 5);
          if (fate < 2) {
            state.DemoteEnd({node, demoting, versions, locations, disk});
          } else if (fate == 2) {
            state.DemoteAbort({node, demoting, versions});
          } else if (fate == 3) {
            // The node's disk evicts one copy, and re-registers what it holds (a restart).
            state.DiskDrop({node, {demoting[0]}, {locations[0]}});
            std::vector<DiskEntry> inventory;
            for (size_t k = 0; k < demoting.size(); ++k) {
              inventory.push_back({demoting[k], 1 + rng() % (64 * kKiB), rng() % 4, locations[k]});
            }
            state.DiskRegister({node, inventory, disk, rng() % 2 == 0});
          } else {
            // The copies were written, but the end is late: some are garbage by then. The node
            // deletes what it is told (acknowledging some twice, as after a lost answer).
            state.DemoteEnd({node, demoting, versions, locations, disk});
            std::vector<uint64_t> ids;
            for (const auto& g : state.DiskGarbageOf(disk, 1 + rng() % 8, 1 << 20)) {
              if (rng() % 4 != 0) ids.push_back(g.id);
            }
            if (!ids.empty()) ids.push_back(ids.front());
            state.DiskGarbageAck({node, disk, ids});
          }
        } else {
          clock.Advance(Millis(1 + rng() % 7));
        }
      }
      done++;
    });
  }
  for (auto& w : workers) w.join();
  run.final_state = state.StateFingerprint();
}

// Committed versions with a persistence of their own, counted the slow way: the state's counter
// (which lets the offload planner skip its scan) must agree after any history.
uint64_t CountExplicitPersistence(const MasterState& state) {
  uint64_t n = 0;
  for (size_t s = 0; s < state.shard_count(); ++s) {
    state.ScanShard(s, [&](std::string_view, const ObjectMeta& meta) {
      n += meta.committed && meta.committed->persistence != PutPersistence::kDefault;
    });
  }
  return n;
}

class OrderedHistoryTest : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(OrderedHistoryTest, ReplayOfAConcurrentRunGivesTheSameState) {
  ManualClock clock;
  std::unique_ptr<MasterState> leader_state;
  RecordedRun run;
  // The coverage checks below need an interleaving that promoted something and committed a put
  // with its own persistence; one that did neither (about 1 in 100) is run again, at most twice.
  for (int attempt = 0; attempt < 3; ++attempt) {
    leader_state = std::make_unique<MasterState>(Policy(GetParam()), &clock);
    run = RecordedRun{};
    DriveConcurrently(*leader_state, clock, 4, 3000, run);
    if (run.promotions_started > 0 && run.most_explicit_persistence > 0) break;
  }
  MasterState& leader = *leader_state;
  ASSERT_GT(run.log.size(), 1000u);
  ASSERT_EQ(run.log.back().seq, run.final_state.seq);
  for (size_t i = 0; i < run.log.size(); ++i) {
    ASSERT_EQ(run.log[i].seq, i + 1) << "the history has a gap or a repeat";
    if (i > 0) {
      ASSERT_GE(run.log[i].now_ms, run.log[i - 1].now_ms) << "time went back";
    }
  }

  // From the initial state, through the wire format of every operation.
  ManualClock other_clock(42);  // a standby's clock means nothing to the replay
  MasterState standby(Policy(GetParam()), &other_clock, /*segment_id_base=*/7);
  ASSERT_TRUE(standby.LoadSnapshot(run.initial).ok());
  for (const Operation& op : run.log) {
    auto decoded = DecodeOperation(EncodeOperation(op));
    ASSERT_TRUE(decoded.ok());
    ASSERT_EQ(EncodeOperation(*decoded), EncodeOperation(op));
    auto applied = standby.Replay(*decoded);
    ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  }
  EXPECT_EQ(standby.last_seq(), run.final_state.seq);
  EXPECT_EQ(standby.Digest(), run.final_state.digest) << "replay diverged from the leader";
  EXPECT_EQ(standby.object_count(), leader.object_count());
  EXPECT_EQ(standby.segments().used_bytes(), leader.segments().used_bytes());
  // Coverage over the whole run: the end state may hold few objects (nodes expire and remount).
  EXPECT_GT(run.most_explicit_persistence, 0u) << "the run committed no put with its own";
  EXPECT_GT(run.promotions_started, 0u) << "the run promoted nothing";
  EXPECT_EQ(leader.explicit_persistence_count(), CountExplicitPersistence(leader));
  EXPECT_EQ(standby.explicit_persistence_count(), CountExplicitPersistence(standby));

  // From the snapshot taken mid-run, plus the operations after it.
  ASSERT_FALSE(run.mid_snapshot.empty());
  MasterState from_snapshot(Policy(GetParam()), &other_clock);
  ASSERT_TRUE(from_snapshot.LoadSnapshot(run.mid_snapshot).ok());
  const uint64_t snapshot_seq = from_snapshot.last_seq();
  ASSERT_GT(snapshot_seq, 0u);
  ASSERT_LT(snapshot_seq, run.final_state.seq);
  for (const Operation& op : run.log) {
    if (op.seq <= snapshot_seq) continue;
    ASSERT_TRUE(from_snapshot.Replay(op).ok());
  }
  EXPECT_EQ(from_snapshot.Digest(), run.final_state.digest) << "snapshot + tail diverged";
  EXPECT_EQ(from_snapshot.explicit_persistence_count(), CountExplicitPersistence(from_snapshot));
}

INSTANTIATE_TEST_SUITE_P(Policies, OrderedHistoryTest,
                         ::testing::Values(EvictionPolicy::kS3Fifo, EvictionPolicy::kLru));

TEST(OrderedHistory, ReplayRefusesGapsAndTimeGoingBack) {
  ManualClock clock;
  MasterState state(Policy(EvictionPolicy::kS3Fifo), &clock);
  Operation op{clock.NowMs(), 2, PingOp{"c", {}}};
  EXPECT_EQ(state.Replay(op).status().code(), ErrorCode::INVALID_PARAMS) << "seq 2 before 1";
  op.seq = 1;
  ASSERT_TRUE(state.Replay(op).ok());
  Operation earlier{clock.NowMs() - 1, 2, PingOp{"c", {}}};
  EXPECT_EQ(state.Replay(earlier).status().code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(state.last_seq(), 1u);
}

TEST(OrderedHistory, ApplyNeverLetsTimeGoBack) {
  ManualClock clock;
  MasterState state(Policy(EvictionPolicy::kS3Fifo), &clock);
  std::vector<Operation> log;
  state.AddObserver([&](const Operation& op, const OpResult&) { log.push_back(op); });
  state.Apply(Operation{5000, 0, PingOp{"a", {}}});
  state.Apply(Operation{4000, 0, PingOp{"b", {}}});  // e.g. a wall clock stepped back
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1].now_ms, 5000);
  EXPECT_EQ(log[1].seq, 2u);
}

// Concurrent Apply calls are combined: one caller's thread applies others' operations. Each
// caller must still learn its own operation's seq (a reply waits for the standbys to have that
// one), and the observers must see every seq once, in order.
TEST(OrderedHistory, EachCallerLearnsItsOwnSeqWhenAnotherThreadAppliedIt) {
  ManualClock clock;
  MasterState state(Policy(EvictionPolicy::kS3Fifo), &clock);
  state.set_apply_turns(32, 1);  // combine whenever one caller waits
  std::mutex mu;
  std::map<uint64_t, std::pair<std::string, std::thread::id>> seen;  // seq -> client, applier
  std::vector<uint64_t> seq_order;
  state.AddObserver([&](const Operation& op, const OpResult&) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));  // let the other callers queue
    std::lock_guard lock(mu);
    seen[op.seq] = {std::get<PingOp>(op.body).client_id, std::this_thread::get_id()};
    seq_order.push_back(op.seq);
  });
  constexpr int kThreads = 8, kCalls = 200;
  struct Call {
    uint64_t seq;
    std::string client;
    std::thread::id caller;
    uint64_t applied_delta;
  };
  std::vector<std::vector<Call>> calls(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        std::string client = "c" + std::to_string(t) + "-" + std::to_string(i);
        const uint64_t before = MasterState::AppliedOnThisThread();
        state.Apply(Operation{0, 0, PingOp{client, {}}});
        calls[t].push_back({MasterState::LastSeqOnThisThread(), client, std::this_thread::get_id(),
                            MasterState::AppliedOnThisThread() - before});
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(seen.size(), size_t{kThreads} * kCalls);
  ASSERT_EQ(seq_order.size(), seen.size());
  for (size_t i = 0; i < seq_order.size(); ++i) ASSERT_EQ(seq_order[i], i + 1);
  size_t applied_elsewhere = 0;
  for (const auto& per_thread : calls) {
    for (const Call& c : per_thread) {
      ASSERT_EQ(c.applied_delta, 1u);
      ASSERT_EQ(seen.at(c.seq).first, c.client);
      applied_elsewhere += seen.at(c.seq).second != c.caller;
    }
  }
  EXPECT_GT(applied_elsewhere, 0u) << "no operation was combined: the test proves nothing";
}

TEST(OrderedHistory, SnapshotUnderAnotherPolicyIsRefused) {
  ManualClock clock;
  MasterState a(Policy(EvictionPolicy::kS3Fifo), &clock);
  MasterState b(Policy(EvictionPolicy::kLru), &clock);
  const uint64_t before = b.Digest();
  EXPECT_EQ(b.LoadSnapshot(a.EncodeSnapshot()).code(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(b.Digest(), before);
}

TEST(OrderedHistory, TruncatedOrCorruptSnapshotsAreRefusedAndChangeNothing) {
  ManualClock clock;
  MasterState leader(Policy(EvictionPolicy::kS3Fifo), &clock);
  RecordedRun run;
  DriveConcurrently(leader, clock, 2, 300, run);
  const std::string good = leader.EncodeSnapshot();
  MasterState target(Policy(EvictionPolicy::kS3Fifo), &clock);
  const uint64_t empty = target.Digest();
  const std::string empty_snapshot = target.EncodeSnapshot();
  for (size_t cut = 0; cut < good.size(); cut += 1 + good.size() / 400) {
    EXPECT_FALSE(target.LoadSnapshot(std::string_view(good).substr(0, cut)).ok()) << cut;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string bad = good;
    bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
    (void)target.LoadSnapshot(bad);  // may parse into another valid state; must not crash
    ASSERT_TRUE(target.LoadSnapshot(empty_snapshot).ok());
  }
  EXPECT_EQ(target.Digest(), empty);
  ASSERT_TRUE(target.LoadSnapshot(good).ok());
  EXPECT_EQ(target.Digest(), leader.Digest());
}

TEST(OrderedHistory, MalformedOperationRecordsAreRefused) {
  Operation op{123, 9, PutEndOp{"w", {"a", "b"}, {1, 2}, {3, 4}}};
  const std::string bytes = EncodeOperation(op);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(DecodeOperation(bytes.substr(0, cut)).ok()) << cut;
  }
  EXPECT_FALSE(DecodeOperation(bytes + "x").ok()) << "trailing bytes";
  std::string bad_index = bytes;
  bad_index[3] = 99;  // seq 9 (1 byte), time 123 (zigzag 246: 2 bytes), then the body index
  EXPECT_FALSE(DecodeOperation(bad_index).ok());
  auto back = DecodeOperation(bytes);
  ASSERT_TRUE(back.ok());
  const auto& end = std::get<PutEndOp>(back->body);
  EXPECT_EQ(end.keys, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(end.put_gens, (std::vector<uint64_t>{3, 4}));
}

TEST(OrderedHistory, HistoryFileReplaysToTheSameStateAndStopsAtATornRecord) {
  ManualClock clock;
  MasterState leader(Policy(EvictionPolicy::kS3Fifo), &clock);
  const std::string path = ::testing::TempDir() + "/history-" + std::to_string(getpid());
  auto file = HistoryFile::Create(path, leader);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  leader.AddObserver([f = file->get()](const Operation& op, const OpResult&) { f->Append(op); });
  RecordedRun run;
  DriveConcurrently(leader, clock, 3, 400, run);
  ASSERT_TRUE((*file)->Flush().ok());

  auto records = ReadHistoryRecords(path);
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), run.log.size() + 1);
  MasterState standby(Policy(EvictionPolicy::kS3Fifo), &clock);
  ASSERT_TRUE(ReplayHistory(*records, standby).ok());
  EXPECT_EQ(standby.Digest(), run.final_state.digest);

  // A crash mid-append leaves a torn last record: the history ends before it.
  file->reset();
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(std::filesystem::file_size(path) - 3)), 0);
  auto torn = ReadHistoryRecords(path);
  ASSERT_TRUE(torn.ok());
  EXPECT_EQ(torn->size(), records->size() - 1);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace granary::master
