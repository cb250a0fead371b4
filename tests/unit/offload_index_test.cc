// The offload planner's index (MasterState::ScanOffloadCandidates): every plan equals what a walk
// over every object picks (the planner's rules applied to the whole state, as it was before the
// index), through random puts, upserts, removes, demotions written, aborted and left under way,
// disk drops, evictions, replica counts up (copies attached) and down, reads, unmounts, node
// expiry and a snapshot reload; and the index holds nothing once the objects are gone.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "common/clock.h"
#include "master/policy/evictor.h"
#include "master/policy/offload_planner.h"
#include "master/state/master_state.h"

namespace granary::master {
namespace {

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;

// The planner's rules over every object (the planner before its index), for comparison.
std::vector<std::string> PlanByWalk(const MasterState& state, const OffloadPolicy& policy,
                                    const std::string& node_id, size_t max_keys,
                                    uint64_t max_bytes) {
  if (max_keys == 0 || max_bytes == 0) return {};
  const bool overrides = state.explicit_persistence_count() > 0;
  if (!overrides && policy.persistence == Persistence::kNone) return {};
  const std::vector<uint64_t> own = state.segments().SegmentsOf(node_id);
  if (own.empty()) return {};
  uint64_t used = 0, capacity = 0;
  for (const auto& u : state.segments().Usage()) {
    if (std::find(own.begin(), own.end(), u.identity->id) == own.end()) continue;
    used += u.stats.used_bytes;
    capacity += u.stats.capacity;
  }
  const bool lazy_due = capacity > 0 && static_cast<double>(used) >=
                                            policy.offload_watermark * static_cast<double>(capacity);
  if (!overrides && policy.persistence == Persistence::kLazy && !lazy_due) return {};
  std::vector<std::tuple<int, int64_t, std::string, uint64_t>> candidates;
  for (size_t s = 0; s < state.shard_count(); ++s) {
    state.ScanShard(s, [&](std::string_view key, const ObjectMeta& meta) {
      if (!meta.committed || meta.demotion()) return;
      const Version& v = *meta.committed;
      const Persistence wanted = EffectivePersistence(v.persistence, policy.persistence);
      if (wanted == Persistence::kNone || (wanted == Persistence::kLazy && !lazy_due)) return;
      if (v.offload_declined) return;
      if (std::any_of(v.disk.begin(), v.disk.end(),
                      [&](const DiskReplica& d) { return d.node_id == node_id; })) {
        return;
      }
      if (std::none_of(v.replicas.begin(), v.replicas.end(), [&](const Extent& e) {
            return std::find(own.begin(), own.end(), e.segment_id) != own.end();
          })) {
        return;
      }
      if (wanted == Persistence::kEager) {
        candidates.emplace_back(0, meta.queue_stamp, key, v.size);
      } else {
        const auto place = LazyOffloadOrder(meta, state.policy().eviction_policy);
        if (place) candidates.emplace_back(place->first, place->second, key, v.size);
      }
    });
  }
  std::sort(candidates.begin(), candidates.end());
  std::vector<std::string> plan;
  uint64_t bytes = 0;
  for (auto& [rank, order, key, size] : candidates) {
    if (plan.size() >= max_keys || bytes >= max_bytes) break;
    plan.push_back(key);
    bytes += size;
  }
  return plan;
}

// Three nodes: n0 (two segments) and n1 with disks, n2 without; 200 keys of every persistence.
class OffloadIndexTest : public ::testing::TestWithParam<Persistence> {
 protected:
  OffloadIndexTest() : state_(Policy(), &clock_), planner_(&state_, {GetParam(), 0.30}) {}
  // The lazy case runs under the prefix eviction policy, which orders lazy offload by its queues.
  MasterPolicy Policy() const {
    MasterPolicy p;
    p.shard_count = 16;  // several keys a shard, so erasures meet other keys' entries
    if (GetParam() == Persistence::kLazy) p.eviction_policy = EvictionPolicy::kPrefix;
    return p;
  }
  void Mount(const std::string& node, const std::string& segment) {
    ASSERT_TRUE(state_.Mount({node, {segment, 6 * kMiB, "127.0.0.1:1", "shm-" + segment, node,
                                     ++token_, true}})
                    .status.ok());
    state_.Ping(node);
  }
  void SetUp() override {
    Mount("n0", "s0a");
    Mount("n0", "s0b");
    Mount("n1", "s1");
    Mount("n2", "s2");
  }
  static std::string Key(uint32_t i) { return "key-" + std::to_string(i); }
  void Check(const std::string& node, size_t max_keys, uint64_t max_bytes) {
    const std::vector<std::string> expected =
        PlanByWalk(state_, planner_.policy(), node, max_keys, max_bytes);
    ASSERT_EQ(planner_.Plan(node, max_keys, max_bytes), expected)
        << "node " << node << ", step " << step_;
    plans_ += 1;
    planned_keys_ += expected.size();
  }

  ManualClock clock_;
  MasterState state_;
  OffloadPlanner planner_;
  uint64_t token_ = 0;
  uint64_t step_ = 0;
  uint64_t plans_ = 0;
  uint64_t planned_keys_ = 0;
};

TEST_P(OffloadIndexTest, PlansEqualAWalkOverEveryObject) {
  // Before any disk registered, the master keeps no index.
  PlacementConfig config;
  auto started = state_.PutStart({"w", {"before"}, {64 * kKiB}, config, false})[0];
  ASSERT_TRUE(started.status.ok());
  ASSERT_TRUE(state_.PutEnd({"w", {"before"}, {1}, {started.put_gen}})[0].ok());
  EXPECT_EQ(state_.offload_index_size(), 0u);
  const std::map<std::string, uint64_t> disks = {{"n0", 0xD0}, {"n1", 0xD1}};
  for (const auto& [node, disk] : disks) {
    ASSERT_TRUE(state_.DiskRegister({node, {}, disk, true}).empty());
  }
  EXPECT_GT(state_.offload_index_size(), 0u) << "the object put before the disk is not listed";

  std::mt19937_64 rng(GetParam() == Persistence::kEager ? 1 : GetParam() == Persistence::kLazy ? 2 : 3);
  auto pick = [&](uint64_t n) { return rng() % n; };
  Evictor evictor(&state_);
  uint64_t location = 1;
  std::map<std::string, uint64_t> copy_rounds;  // each node's copy rounds count from 1
  const std::vector<std::string> nodes = {"n0", "n1"};
  std::vector<std::tuple<std::string, std::string, uint64_t>> under_way;  // node, key, version
  for (step_ = 0; step_ < 3000; ++step_) {
    clock_.Advance(Millis(1 + pick(5)));
    const std::string key = Key(static_cast<uint32_t>(pick(200)));
    switch (pick(12)) {
      case 0:
      case 1: {  // a put or an upsert of 1-3 keys, of any persistence and 1-2 replicas (under
                 // prefix a batch's last key is its tail, which lazy offload skips until read)
        PlacementConfig c;
        c.persistence = static_cast<PutPersistence>(pick(4));
        c.replica_num = 1 + static_cast<uint32_t>(pick(2));
        std::vector<std::string> batch = {key};
        for (uint64_t extra = pick(3); extra > 0; --extra) {
          std::string other = Key(static_cast<uint32_t>(pick(200)));
          if (std::find(batch.begin(), batch.end(), other) == batch.end()) batch.push_back(other);
        }
        std::vector<uint64_t> sizes;
        for (size_t i = 0; i < batch.size(); ++i) sizes.push_back((1 + pick(32)) * 4 * kKiB);
        auto started = state_.PutStart({"w", batch, sizes, c, pick(2) == 0});
        PutEndOp end{"w", {}, {}, {}};
        for (size_t i = 0; i < started.size(); ++i) {
          if (!started[i].status.ok()) continue;
          end.keys.push_back(batch[i]);
          end.checksums.push_back(step_);
          end.put_gens.push_back(started[i].put_gen);
        }
        if (!end.keys.empty()) state_.PutEnd(std::move(end));
        break;
      }
      case 2:
        state_.Remove({{key}, true});
        break;
      case 3:
      case 4: {  // a node offloads what it was told, then writes, gives up or stays under way
        const std::string& node = nodes[pick(2)];
        const size_t max_keys = 1 + pick(12);
        const uint64_t max_bytes = pick(4) == 0 ? 64 * kKiB : 64 * kMiB;
        Check(node, max_keys, max_bytes);
        std::vector<std::string> plan = planner_.Plan(node, max_keys, max_bytes);
        auto demoted = state_.DemoteStart({node, plan, disks.at(node)});
        for (size_t i = 0; i < plan.size(); ++i) {
          if (!demoted[i].status.ok()) continue;
          switch (pick(3)) {
            case 0:
              state_.DemoteEnd({node, {plan[i]}, {demoted[i].version_gen}, {location++},
                                disks.at(node)});
              break;
            case 1:
              state_.DemoteAbort({node, {plan[i]}, {demoted[i].version_gen}});
              break;
            default:  // under way: a later step may end it
              under_way.emplace_back(node, plan[i], demoted[i].version_gen);
          }
        }
        break;
      }
      case 5: {  // a disk drops a copy it holds (its disk evicted it)
        auto stat = state_.Stat(key);
        if (stat.ok() && !stat->disk.empty()) {
          const DiskReplica& d = stat->disk[pick(stat->disk.size())];
          state_.DiskDrop({d.node_id, {key}, {d.location}});
        }
        break;
      }
      case 6:  // end a demotion left under way: written or given up
        if (!under_way.empty()) {
          const size_t i = pick(under_way.size());
          const auto [node, demoted_key, gen] = under_way[i];
          under_way.erase(under_way.begin() + static_cast<std::ptrdiff_t>(i));
          if (pick(2) == 0) {
            state_.DemoteEnd({node, {demoted_key}, {gen}, {location++}, disks.at(node)});
          } else {
            state_.DemoteAbort({node, {demoted_key}, {gen}});
          }
        }
        break;
      case 7:
        evictor.EvictBytes((1 + pick(8)) * 64 * kKiB);
        break;
      case 8: {  // replica counts: down at once, up by a copy into any node's segment
        state_.SetReplicas({{key}, 1 + static_cast<uint32_t>(pick(3))});
        const std::string copier = "n" + std::to_string(pick(3));
        const uint64_t round = ++copy_rounds[copier];
        auto copy = state_.ReplicaCopyStart({copier, {key}, round})[0];
        if (copy.status.ok()) {
          state_.ReplicaCopyEnd({copier, round, {key}, {copy.version_gen}, {1}});
        }
        break;
      }
      case 9:  // reads move last access (the lazy order)
        state_.GetReplicaList({"r", {key}});
        state_.FinishRead({"r", {key}});
        break;
      case 10:
        if (pick(40) == 0) {  // n2's memory goes and comes back empty
          state_.Unmount({"n2", "s2"});
          Mount("n2", "s2");
        }
        break;
      default:
        Check(nodes[pick(2)], 1 + pick(64), 64 * kMiB);
        break;
    }
  }
  Check("n0", 4096, 1ull << 40);
  Check("n1", 4096, 1ull << 40);
  EXPECT_GT(planned_keys_, 100u) << "the walk never named anything: the comparison proves little";

  // A reloaded state (a standby's snapshot) lists the same candidates.
  ManualClock clock2;
  clock2.Advance(Millis(clock_.NowMs()));
  MasterState reloaded(Policy(), &clock2);
  ASSERT_TRUE(reloaded.LoadSnapshot(state_.EncodeSnapshot()).ok());
  OffloadPlanner reloaded_planner(&reloaded, planner_.policy());
  for (const auto& node : nodes) {
    EXPECT_EQ(reloaded_planner.Plan(node, 4096, 1ull << 40),
              PlanByWalk(reloaded, planner_.policy(), node, 4096, 1ull << 40));
  }

  // Node n1 expires: its disk copies go, and n0's memory of them is offered again.
  clock_.Advance(Millis(state_.policy().client_ttl_ms + 1));
  for (const std::string node : {"n0", "n2", "w", "r"}) state_.Ping(node);
  state_.ExpireClient("n1");
  Check("n0", 4096, 1ull << 40);

  // Nothing stays listed for objects that are gone (n2's segment, whose node has no disk and
  // never plans, included).
  for (const auto& [node, demoted_key, gen] : under_way) {
    state_.DemoteAbort({node, {demoted_key}, {gen}});
  }
  state_.RemoveAll({true});
  clock_.Advance(Millis(state_.policy().put_release_timeout_ms + 1));
  state_.Sweep();
  Check("n0", 4096, 1ull << 40);
  EXPECT_EQ(state_.object_count(), 0u);
  EXPECT_EQ(state_.offload_index_size(), 0u) << "the index kept keys of erased objects";
}

INSTANTIATE_TEST_SUITE_P(Policies, OffloadIndexTest,
                         ::testing::Values(Persistence::kEager, Persistence::kLazy,
                                           Persistence::kNone));

}  // namespace
}  // namespace granary::master
