// MasterState: the queries (no operation; they take shard locks and change nothing).
#include "master/state/master_state.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

#include "master/state/state_internal.h"

namespace granary::master {

using namespace internal;

// ---------------------------------------------------------------------------------------------
// Queries

std::vector<int32_t> MasterState::BatchExist(const std::vector<std::string>& keys) const {
  std::vector<std::string_view> views(keys.begin(), keys.end());
  return BatchExist(std::span<const std::string_view>(views));
}

std::vector<int32_t> MasterState::BatchExist(std::span<const std::string_view> keys) const {
  std::vector<int32_t> results(keys.size(), 0);
  if (Status limit = BatchLimit(keys.size()); !limit.ok()) {
    std::fill(results.begin(), results.end(), static_cast<int32_t>(limit.code()));
    return results;
  }
  FindEach(keys, [&](size_t i, const ObjectMeta* found) {
    if (Status s = ValidateKey(keys[i]); !s.ok()) {
      results[i] = static_cast<int32_t>(s.code());
    } else {
      results[i] = found != nullptr && found->committed ? 1 : 0;
    }
  });
  return results;
}

void MasterState::FindEach(std::span<const std::string_view> keys,
                           const std::function<void(size_t, const ObjectMeta*)>& visit) const {
  const ShardGroups groups = GroupByShard(keys);
  std::vector<ShardGroups::Group> run;
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<const ObjectMeta*> found(keys.size(), nullptr);
  auto finish_run = [&] {
    FindRun(run, keys, found);
    for (const auto& group : run) {
      for (uint32_t i : group.indices) visit(i, found[i]);
    }
    locks.clear();
    run.clear();
  };
  for (const auto& group : groups) {
    locks.emplace_back(shards_[group.shard]->mu);
    run.push_back(group);
    if (run.size() == kLockedShards) finish_run();
  }
  if (!run.empty()) finish_run();
}

void MasterState::FindEach(std::span<const std::string_view> keys,
                           const std::function<void(size_t, ObjectMeta*)>& visit) {
  // The entries are this (non-const) state's: the const lookup's answer may be written through.
  std::as_const(*this).FindEach(keys, [&](size_t i, const ObjectMeta* found) {
    visit(i, const_cast<ObjectMeta*>(found));
  });
}

void MasterState::FindRun(std::span<const ShardGroups::Group> run,
                          std::span<const std::string_view> keys,
                          std::vector<const ObjectMeta*>& found) const {
  struct Probe {
    uint32_t key = 0;
    const ObjectTable* objects = nullptr;
    uint64_t hash = 0;
  };
  std::vector<Probe> probes;
  probes.reserve(keys.size());
  for (const auto& [shard_index, indices] : run) {
    const ObjectTable& objects = shards_[shard_index]->objects;
    for (uint32_t i : indices) {
      found[i] = nullptr;
      if (objects.empty()) continue;
      probes.push_back({i, &objects, ObjectTable::Hash(keys[i])});
    }
  }
  // Stage by stage over the run: each stage's loads are independent of one another.
  for (const Probe& p : probes) p.objects->Prefetch(p.hash);  // the home slot
  for (const Probe& p : probes) {  // the first entry with the hash's 16 bits: key and version
    if (const ObjectEntry* e = p.objects->FirstTagged(p.hash)) {
      __builtin_prefetch(e->first.block());
      __builtin_prefetch(&e->second);
    }
  }
  for (const Probe& p : probes) {
    auto it = p.objects->find(keys[p.key], p.hash);
    if (it != p.objects->end()) found[p.key] = &it->second;
  }
}

std::vector<int64_t> MasterState::BatchGetSize(const std::vector<std::string>& keys) const {
  std::vector<int64_t> results(keys.size());
  if (Status limit = BatchLimit(keys.size()); !limit.ok()) {
    std::fill(results.begin(), results.end(), static_cast<int64_t>(limit.code()));
    return results;
  }
  for (const auto& [shard_index, indices] : GroupByShard(keys)) {
    const Shard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    for (size_t i : indices) {
      if (Status s = ValidateKey(keys[i]); !s.ok()) {
        results[i] = static_cast<int64_t>(s.code());
        continue;
      }
      auto it = shard.objects.find(keys[i]);
      if (it == shard.objects.end()) {
        results[i] = static_cast<int64_t>(ErrorCode::OBJECT_NOT_FOUND);
      } else if (!it->second.committed) {
        results[i] = static_cast<int64_t>(ErrorCode::REPLICA_IS_NOT_READY);
      } else {
        results[i] = static_cast<int64_t>(it->second.committed->size);
      }
    }
  }
  return results;
}

Result<uint32_t> MasterState::PrefixMatch(const std::vector<std::string>& keys) const {
  if (Status limit = BatchLimit(keys.size()); !limit.ok()) return limit;
  std::vector<int32_t> exist = BatchExist(keys);
  uint32_t matched = 0;
  while (matched < exist.size() && exist[matched] == 1) ++matched;
  return matched;
}

Result<ObjectStat> MasterState::Stat(const std::string& key) const {
  if (Status s = ValidateKey(key); !s.ok()) return s;
  const Shard& shard = *shards_[ShardOf(key)];
  std::lock_guard lock(shard.mu);
  auto it = shard.objects.find(key);
  if (it == shard.objects.end()) return NotFound(key);
  const ObjectMeta& meta = it->second;
  const int64_t now = clock_->NowMs();
  ObjectStat stat;
  stat.committed = meta.committed.has_value();
  stat.pending = meta.pending().has_value();
  if (!meta.committed && !meta.pending()) return NotFound(key);  // only a demotion's leftovers
  const Version& shown = meta.committed ? *meta.committed : meta.pending()->version;
  stat.size = shown.size;
  stat.checksum = shown.checksum;
  stat.replicas = shown.replicas.ToVector();
  for (const auto& lock_entry : meta.readers()) {
    if (lock_entry.expiry_ms > now) stat.read_locks += lock_entry.count;
  }
  stat.hard_pinned = meta.hard_pinned;
  stat.soft_pinned = meta.IsSoftPinned(now);
  stat.idle_ms = meta.last_access_ms ? now - meta.last_access_ms : 0;
  stat.put_gen = meta.pending() ? meta.pending()->gen : 0;
  stat.disk = shown.disk.ToVector();
  stat.demoting = meta.demotion().has_value();
  stat.promoting = meta.promotion().has_value() && !meta.promotion()->copy;
  stat.copying = meta.promotion().has_value() && meta.promotion()->copy;
  stat.want_replicas = shown.want_replicas;
  return stat;
}

Result<QueryResult> MasterState::QueryByRegex(const std::string& pattern, size_t limit,
                                              const KeyScope* scope) const {
  auto re = CompilePattern(pattern);
  if (!re.ok()) return re.status();
  QueryResult result;
  size_t reply_bytes = 0;
  for (const auto& shard_ptr : shards_) {
    std::lock_guard lock(shard_ptr->mu);
    for (const auto& [held, meta] : shard_ptr->objects) {
      std::string_view key = held;
      if (!meta.committed || (scope && !scope->Contains(held, &key)) ||
          !RE2::PartialMatch(key, **re)) {
        continue;
      }
      if (result.objects.size() >= limit || reply_bytes + key.size() > kMaxQueryReplyBytes) {
        result.truncated = true;
        return result;
      }
      reply_bytes += key.size();
      result.objects.push_back(
          {std::string(key), meta.committed->size, static_cast<uint32_t>(meta.committed->replicas.size())});
    }
  }
  return result;
}

void MasterState::ScanShard(
    size_t i, const std::function<void(std::string_view, const ObjectMeta&)>& fn) const {
  const Shard& shard = *shards_[i];
  std::lock_guard lock(shard.mu);
  for (const auto& [key, meta] : shard.objects) fn(key, meta);
}

}  // namespace granary::master
