// The PutStarts of one apply turn, applied as one group on the turn's threads.
//
// One by one, a PutStart's key is checked and inserted in its shard, then placed on segments
// (the allocators and the generation counter: global, in order), then marked pending in its
// shard. A group does the same work in three phases: the checks of every op's keys shard by
// shard on the turn's threads (ApplyCombiner::Helpers), the placements in op order on the turn
// holder's, the inserts shard by shard again. Why the state and the results are those of one by
// one, in seq order (what replay and the digest rely on):
// - the placements run in the same order (op by op, each op's keys shard by shard as
//   ApplyPutStart walks them), with the same inputs: a check or an insert touches no allocator,
//   and the generation counter moves only there;
// - a shard phase touches only its shard and counters that add (tenant usage, pending count);
// - no key appears twice in the group, so no op's check depends on another's insert;
// - no key has a pending write: only MayWrite's zombie and retry cases free space or clear a
//   pending, and those change what later placements see;
// - no key has an empty entry (no version, pending, demotion or promotion): one by one, its
//   failed placement erases it; a group would keep it.
// Observers run after the whole group's changes (still in seq order, under the apply lock): they
// must not read the state. Nothing here may throw (GroupRunner): one allocation failing ends
// the process rather than leave a group half applied.
// Phase one only reads; if it finds a repeated key or a pending write, the ops are applied one
// by one instead (ApplyLocked), as if no group had been tried.
#include <algorithm>
#include <atomic>

#include "master/state/master_state.h"
#include "master/state/state_internal.h"

namespace granary::master {

namespace {
// A group needs this many keys over its ops before its threads pay for their hand-offs.
constexpr size_t kMinGroupKeys = 64;
constexpr size_t kMaxGroupParts = 16;
enum KeyPlan : uint8_t { kSkip = 0, kNewKey = 1, kExistingKey = 2 };

// Calls fn(put, shard, indices) with the shard's lock held, for each op of the group not refused
// whole and each of its shard groups that falls to `part` (shard % parts), ops in order.
template <typename Puts, typename Shards, typename Fn>
void ForEachShardOfPart(Puts& puts, const Shards& shards, size_t parts, size_t part, Fn fn) {
  for (auto& put : puts) {
    if (!put.batch_error.ok()) continue;
    for (const auto& [shard_index, indices] : *put.call->prepared->groups) {
      if (shard_index % parts != part) continue;
      auto& shard = *shards[shard_index];
      std::lock_guard lock(shard.mu);
      fn(put, shard, indices);
    }
  }
}
}  // namespace

size_t MasterState::PutGroupRunner::RunGroup(std::span<void* const> tags,
                                            ApplyCombiner::Helpers& helpers) noexcept {
  return state->ApplyPutStartGroup(tags, helpers);
}

size_t MasterState::ApplyPutStartGroup(std::span<void* const> tags,
                                       ApplyCombiner::Helpers& helpers) {
  size_t n = 0;
  size_t keys = 0;
  while (n < tags.size() && tags[n] != nullptr) {
    const auto* call = static_cast<const PutStartCall*>(tags[n]);
    if (PreparedGroups(call->prepared) == nullptr) break;  // made for other shards: one by one
    keys += std::get<PutStartOp>(call->op->body).keys.size();
    ++n;
  }
  const size_t parts = std::min(helpers.available() + 1, kMaxGroupParts);
  if (n < 2 || parts < 2 || keys < kMinGroupKeys) return 0;

  struct Put {
    PutStartCall* call;
    const PutStartOp* op;
    Status batch_error;
    std::vector<PutStartKeyResult> results;
    std::vector<uint8_t> plan;  // KeyPlan per key
  };
  struct Group {
    MasterState* self;
    std::vector<Put> puts;
    size_t parts;
    std::vector<std::vector<uint64_t>> hashes;  // per part: its keys' hashes
    std::atomic<bool> one_by_one{false};
  } g{this, {}, parts, std::vector<std::vector<uint64_t>>(parts), {}};
  g.puts.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    auto* call = static_cast<PutStartCall*>(tags[k]);
    const auto& op = std::get<PutStartOp>(call->op->body);
    Put& put = g.puts.emplace_back(Put{call, &op, PutStartBatchError(op), {}, {}});
    put.results.resize(op.keys.size());
    put.plan.assign(op.keys.size(), kSkip);
  }

  // Phase one, shard by shard: each key's refusal, or its plan; reads only.
  helpers.ParallelFor(parts, [](void* ctx, size_t part) noexcept {
    Group& g = *static_cast<Group*>(ctx);
    std::vector<uint64_t>& hashes = g.hashes[part];
    ForEachShardOfPart(g.puts, g.self->shards_, g.parts, part, [&](Put& put, Shard& shard,
                                                                  const auto& indices) {
      const PutStartOp& op = *put.op;
      for (size_t i : indices) {
        if (Status s = PutStartKeyError(op.keys[i], op.sizes[i]); !s.ok()) {
          put.results[i].status = std::move(s);
          continue;
        }
        hashes.push_back(put.call->prepared->hashes[i]);
        auto it = shard.objects.find(op.keys[i]);
        if (it == shard.objects.end()) {
          put.plan[i] = kNewKey;
        } else if (const ObjectMeta& meta = it->second;
                   meta.pending() || (!meta.committed && !meta.demotion() && !meta.promotion())) {
          // A pending write may be a zombie or a retry, which free space; an empty entry
          // (left by a failed reservation commit) is erased when its placement fails.
          g.one_by_one.store(true, std::memory_order_relaxed);
        } else if (meta.committed && !op.upsert) {
          put.results[i].status = Status(ErrorCode::OBJECT_ALREADY_EXISTS, "object exists");
        } else {
          put.plan[i] = kExistingKey;
        }
      }
    });
    std::sort(hashes.begin(), hashes.end());
    if (std::adjacent_find(hashes.begin(), hashes.end()) != hashes.end()) {
      g.one_by_one.store(true, std::memory_order_relaxed);  // a key twice (or a hash collision)
    }
  }, &g);

  if (g.one_by_one.load(std::memory_order_relaxed)) {
    grouped_one_by_one_.fetch_add(n, std::memory_order_relaxed);
    for (Put& put : g.puts) *put.call->result = ApplyNext(*put.call->op, put.call->prepared);
    return n;
  }

  // Phase two, in order on this thread: each op's seq and time, and its keys' placements.
  for (Put& put : g.puts) {
    Operation& op = *put.call->op;
    StampNext(op);
    last_seq_ = op.seq;
    last_now_ms_ = op.now_ms;
    if (!put.batch_error.ok()) {
      for (auto& r : put.results) r.status = put.batch_error;
      continue;
    }
    const SegmentTable::Placement order =
        segments_.PlacementOrder(put.op->config.preferred_segments);
    for (const auto& [shard_index, indices] : *put.call->prepared->groups) {
      for (size_t i : indices) {
        if (put.plan[i] == kSkip) continue;
        put.results[i] = PlacePut(*put.op, put.op->sizes[i], order, i, op.now_ms);
        if (!put.results[i].status.ok()) put.plan[i] = kSkip;
      }
    }
  }

  // Phase three, shard by shard: the placed keys become pending writes.
  helpers.ParallelFor(parts, [](void* ctx, size_t part) noexcept {
    Group& g = *static_cast<Group*>(ctx);
    ForEachShardOfPart(g.puts, g.self->shards_, g.parts, part, [&](Put& put, Shard& shard,
                                                                  const auto& indices) {
      const PutStartOp& op = *put.op;
      for (size_t i : indices) {
        if (put.plan[i] == kSkip) continue;
        ObjectTable::EntryHandle& entry = put.call->prepared->entries[i];
        ObjectIter it = put.plan[i] == kNewKey && entry != nullptr
                            ? shard.objects.insert(entry).first
                            : shard.objects.try_emplace(op.keys[i]).first;
        g.self->SetPending(shard, it,
                           g.self->MakePending(op, op.sizes[i], put.results[i],
                                               put.call->op->now_ms));
      }
    });
  }, &g);

  // In order again: each op's result, and its observers.
  for (Put& put : g.puts) {
    *put.call->result = std::move(put.results);
    for (const auto& observer : observers_) observer(*put.call->op, *put.call->result);
  }
  return n;
}

}  // namespace granary::master
