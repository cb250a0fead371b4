#include "master/ha/coordinator.h"

#include <algorithm>

#include "common/host.h"
#include "common/logging.h"
#include "master/state/state_codec.h"

namespace granary::master::ha {

namespace {
using SteadyClock = std::chrono::steady_clock;
using etcd::Compare;
using etcd::TxnOp;

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             SteadyClock::now().time_since_epoch())
      .count();
}

std::string MemberRecord(const HaOptions& o, const std::string& id) {
  nlohmann::json doc;
  doc["id"] = id;
  doc["grpc"] = o.advertise;
  doc["fast_port"] = o.fast_port;
  doc["http_port"] = o.http_port;
  return doc.dump();
}
}  // namespace

Coordinator::Coordinator(MasterState* state, HaOptions options, MetricsRegistry* metrics)
    : state_(state),
      options_(std::move(options)),
      member_id_(UniqueProcessId("master")),
      log_(options_.log_bytes) {
  StreamOptions stream;
  stream.standby_timeout = options_.standby_timeout;
  streams_ = std::make_unique<StreamServer>(state_, &log_, &standbys_, stream);
  RegisterMetrics(metrics);
}

void Coordinator::SetEndpoints(std::string advertise, uint16_t fast_port, uint16_t http_port,
                               std::string fast_local) {
  options_.advertise = std::move(advertise);
  options_.fast_port = fast_port;
  options_.fast_local = std::move(fast_local);
  options_.http_port = http_port;
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Record(const Operation& op) { log_.Append(op.seq, EncodeOperation(op)); }

Status Coordinator::Start() {
  auto client = etcd::EtcdClient::Connect(options_.etcd_endpoints, options_.etcd_timeout_ms,
                                          options_.etcd_credentials);
  if (!client.ok()) return client.status();
  etcd_ = std::move(*client);
  follower_ = std::make_unique<StandbyFollower>(
      state_, &log_,
      StandbyFollower::Options{member_id_, options_.advertise, options_.standby_timeout,
                               options_.secret, options_.tls});
  {
    std::lock_guard lock(mu_);
    stopping_ = false;
  }
  GLOG_INFO("HA: member {} of cluster '{}' (etcd {}), advertising {}; sync standbys {}",
            member_id_, options_.cluster_id, options_.etcd_endpoints, options_.advertise,
            options_.sync_standbys);
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
  main_ = std::thread([this] { MainLoop(); });
  return Status::Ok();
}

void Coordinator::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (main_.joinable()) main_.join();
  if (keepalive_.joinable()) keepalive_.join();
  watch_.reset();
  if (role() == Role::kLeader) StepDown("shutting down");
  if (follower_) follower_->Stop();
  int64_t lease = 0;
  {
    std::lock_guard lock(mu_);
    lease = lease_id_;
    lease_id_ = 0;
  }
  // Revoking deletes the leader and member keys now: a standby takes over without waiting for
  // the lease to run out.
  if (etcd_ && lease != 0) (void)etcd_->RevokeLease(lease);
  log_.Close();
}

Coordinator::Role Coordinator::role() const {
  std::lock_guard lock(mu_);
  return role_;
}

// ---- the gate ----

bool Coordinator::LeaseFresh() const { return SteadyNs() < lease_until_ns_.load(); }

Status Coordinator::Enter(bool update) {
  inflight_.fetch_add(1);
  if (!serving_.load() || !LeaseFresh()) {
    inflight_.fetch_sub(1);
    std::string where;
    {
      std::lock_guard lock(mu_);
      if (!leader_seen_.grpc.empty() && leader_seen_.id != member_id_) {
        where = "; the leader is at " + leader_seen_.grpc;
      }
    }
    return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "this master is not the leader" + where);
  }
  if (update && !standbys_.Ready()) {
    inflight_.fetch_sub(1);
    return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS,
                  "the leader has no synchronous standby yet (--sync-standbys 1): try again");
  }
  return Status::Ok();
}

void Coordinator::Exit() { inflight_.fetch_sub(1); }

Status Coordinator::Commit(uint64_t seq) {
  Status s = standbys_.WaitAcked(seq, SteadyClock::now() + options_.sync_timeout);
  if (!s.ok()) return s;
  if (!LeaseFresh()) {
    return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                  "the leader's lease ran out before the reply; the operation's outcome is "
                  "unknown");
  }
  return Status::Ok();
}

// ---- lease ----

void Coordinator::KeepAliveLoop() {
  std::unique_ptr<etcd::KeepAlive> keepalive;
  int64_t ttl_ms = options_.leader_lease.count();
  bool first = true;
  for (;;) {  // ends at Stop(); every pass renews once or registers, then sleeps
    {
      std::unique_lock lock(mu_);
      if (!first) {
        wake_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(ttl_ms / 5, 50)),
                       [&] { return stopping_; });
      }
      first = false;
      if (stopping_) return;
    }
    int64_t lease = 0;
    {
      std::lock_guard lock(mu_);
      lease = lease_lost_ ? 0 : lease_id_;
    }
    if (lease == 0) {
      // (Re)register: a new lease and our member key under it.
      keepalive.reset();
      const int64_t ttl_s = std::max<int64_t>(1, (options_.leader_lease.count() + 999) / 1000);
      auto granted = etcd_->GrantLease(ttl_s);
      if (!granted.ok()) {
        GLOG_WARN("HA: etcd lease grant failed: {}", granted.status().ToString());
        continue;
      }
      auto put = etcd_->Put(etcd::MemberKey(options_.cluster_id, member_id_),
                            MemberRecord(options_, member_id_), granted->id);
      auto ka = etcd_->StartKeepAlive(granted->id);
      if (!put.ok() || !ka.ok()) {
        (void)etcd_->RevokeLease(granted->id);
        continue;
      }
      keepalive = std::move(*ka);
      ttl_ms = granted->ttl_seconds * 1000;
      std::lock_guard lock(mu_);
      lease_id_ = granted->id;
      lease_lost_ = false;
      lease = granted->id;
      GLOG_INFO("HA: registered with lease {:x} (TTL {} s)", lease, granted->ttl_seconds);
    }
    const int64_t started = SteadyNs();
    auto renewed = keepalive->Renew();
    bool counts = true;
    {
      // A leader's serving clock runs on the lease it won its term under: a later lease (its
      // first one expired, and it registered again) holds no leader key, so it extends nothing
      // until this master has stepped down.
      std::lock_guard lock(mu_);
      counts = role_ != Role::kLeader || lease == term_lease_;
    }
    if (renewed.ok() && *renewed > 0) {
      ttl_ms = *renewed * 1000;
      // etcd counts the TTL from when it got the renewal, which is after `started`.
      if (counts) {
        lease_until_ns_.store(started + (ttl_ms - options_.lease_margin.count()) * 1'000'000);
      }
    } else if (!renewed.ok() && renewed.code() == ErrorCode::OBJECT_NOT_FOUND) {
      GLOG_WARN("HA: etcd no longer knows lease {:x}: registering again", lease);
      lease_until_ns_.store(0);
      std::lock_guard lock(mu_);
      lease_lost_ = true;
    } else {
      GLOG_WARN("HA: lease renewal failed: {}",
                renewed.ok() ? std::string("expired") : renewed.status().ToString());
    }
    Poke();
  }
}

void Coordinator::Poke() {
  {
    std::lock_guard lock(mu_);
    poke_ = true;
  }
  wake_.notify_all();
}

// ---- the role machine ----

void Coordinator::MainLoop() {
  for (;;) {  // ends at Stop(); each pass reconciles once and waits a tick (or a watch event)
    {
      std::unique_lock lock(mu_);
      if (stopping_) return;
    }
    Reconcile();
    std::unique_lock lock(mu_);
    wake_.wait_for(lock, options_.tick, [&] { return stopping_ || poke_; });
    poke_ = false;
    if (stopping_) return;
  }
}

void Coordinator::Reconcile() {
  if (watch_broken_.exchange(false)) watch_.reset();
  if (!watch_) {
    // Wakes us as soon as the leader key changes (a campaign need not wait for the next tick).
    auto w = etcd_->StartWatch(
        etcd::LeaderKey(options_.cluster_id), false, 0,
        [this](const std::vector<etcd::WatchEvent>&) { Poke(); },
        [this](Status) {
          watch_broken_ = true;  // re-created by the next pass (not here: on its own thread)
          Poke();
        });
    if (w.ok()) watch_ = std::move(*w);
  }
  if (role() == Role::kLeader) {
    ReconcileLeader();
  } else {
    ReconcileStandby();
  }
}

void Coordinator::ReconcileStandby() {
  auto leader = etcd_->Get(etcd::LeaderKey(options_.cluster_id));
  if (!leader.ok()) return;  // etcd unreachable: keep following whom we follow
  if (*leader) {
    auto record = etcd::ParseLeaderRecord((*leader)->value);
    if (!record.ok()) return;
    {
      std::lock_guard lock(mu_);
      leader_seen_ = *record;
    }
    if (record->id == member_id_) {
      // Our own key from a term we left (we stepped down while etcd still held our lease):
      // delete it so that the synchronous standby may campaign.
      (void)etcd_->Txn({Compare::CreateRevision(etcd::LeaderKey(options_.cluster_id),
                                                Compare::Result::kEqual,
                                                (*leader)->create_revision)},
                       {TxnOp::Delete(etcd::LeaderKey(options_.cluster_id))});
      return;
    }
    const std::string host = etcd::HostOf(record->grpc);
    if (!host.empty() && record->fast_port != 0) {
      follower_->Follow(host, record->fast_port, record->term);
    }
    return;
  }
  bool registered = false;
  {
    std::lock_guard lock(mu_);
    registered = lease_id_ != 0 && !lease_lost_;
  }
  if (registered && LeaseFresh()) (void)Campaign();
}

bool Coordinator::Campaign() {
  const std::string leader_key = etcd::LeaderKey(options_.cluster_id);
  const std::string sync_key = etcd::SyncKey(options_.cluster_id);
  auto sync = etcd_->Get(sync_key);
  if (!sync.ok()) return false;
  std::vector<Compare> guard{Compare::CreateRevision(leader_key, Compare::Result::kEqual, 0)};
  bool fresh = true;
  std::string why;
  if (!*sync) {
    guard.push_back(Compare::CreateRevision(sync_key, Compare::Result::kEqual, 0));
    why = "no master was ever synchronous";
  } else if ((*sync)->value == member_id_) {
    guard.push_back(Compare::Value(sync_key, Compare::Result::kEqual, member_id_));
    fresh = !follower_->state_valid();
    why = "the synchronous standby";
  } else {
    const std::string member_key = etcd::MemberKey(options_.cluster_id, (*sync)->value);
    auto member = etcd_->Get(member_key);
    if (!member.ok() || *member) return false;  // the synchronous standby lives: it takes over
    guard.push_back(Compare::Value(sync_key, Compare::Result::kEqual, (*sync)->value));
    guard.push_back(Compare::CreateRevision(member_key, Compare::Result::kEqual, 0));
    why = "the synchronous standby " + (*sync)->value + " is gone";
  }
  int64_t lease = 0;
  {
    std::lock_guard lock(mu_);
    lease = lease_id_;
  }
  etcd::LeaderRecord record{member_id_, options_.advertise, options_.fast_port,
                            options_.http_port, 0, false, options_.fast_local};
  auto won = etcd_->Txn(guard, {TxnOp::Put(leader_key, etcd::EncodeLeaderRecord(record), lease),
                                TxnOp::Put(sync_key, member_id_)});
  if (!won.ok() || !won->succeeded) return false;
  const uint64_t term = static_cast<uint64_t>(won->revision);
  GLOG_WARN("HA: won the election for term {} ({}){}", term, why,
            fresh ? ": starting from an empty state, as a restarted master" : "");
  Promote(term, fresh);
  return true;
}

void Coordinator::Promote(uint64_t term, bool fresh) {
  follower_->Stop();  // from here on, nothing but this master's own calls changes the state
  // Stop applied what was still queued: a replay refused there leaves a state no history holds.
  fresh = fresh || !follower_->state_valid();
  Lineage lineage;
  if (fresh) {
    state_->ResetEmpty();
    if (options_.restart_settle) state_->AssumeEarlierCacheLeases();
    log_.Reset(0);
    lineage = {TermStart{term, 1}};
    fresh_starts_->Inc();
  } else {
    lineage = follower_->lineage();
    lineage.push_back(TermStart{term, state_->last_seq() + 1});
  }
  standbys_.Reopen(state_->last_seq());
  streams_->Lead(term, lineage);
  term_.store(term);
  {
    std::lock_guard lock(mu_);
    role_ = Role::kLeader;
    term_lease_ = lease_id_;
    lineage_ = lineage;
    published_serving_ = false;
    serving_alone_ = false;
    sync_missing_since_ = SteadyClock::now();
    leader_seen_ = etcd::LeaderRecord{member_id_, options_.advertise, options_.fast_port,
                                      options_.http_port, term, false, options_.fast_local};
  }
  elections_won_->Inc();
  if (options_.sync_standbys == 0) standbys_.SetSync("", false);
}

void Coordinator::StepDown(const std::string& why) {
  GLOG_WARN("HA: stepping down from term {}: {}", term_.load(), why);
  serving_.store(false);
  streams_->StopLeading();
  standbys_.Close();  // replies waiting for a standby fail: their outcome is unknown
  // The state is ours alone again only once the calls in flight have left it.
  const auto deadline = SteadyClock::now() + std::chrono::seconds(30);
  while (inflight_.load() > 0 && SteadyClock::now() < deadline) {  // bounded by the deadline
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Lineage lineage;
  {
    std::lock_guard lock(mu_);
    role_ = Role::kStandby;
    lineage = lineage_;
    published_serving_ = false;
    last_step_down_ = why;
  }
  term_.store(0);
  // Our history may hold operations no standby got: the next leader decides whether we go on
  // from where we are or start over from its snapshot.
  follower_->set_lineage(std::move(lineage));
  follower_->set_state_valid(true);
  step_downs_->Inc();
}

void Coordinator::ReconcileLeader() {
  bool lost = false;
  {
    std::lock_guard lock(mu_);
    lost = lease_lost_;
  }
  if (lost || !LeaseFresh()) {
    StepDown(lost ? "etcd expired our lease" : "the lease could not be renewed in time");
    return;
  }
  const std::string leader_key = etcd::LeaderKey(options_.cluster_id);
  auto leader = etcd_->Get(leader_key);
  if (leader.ok() &&
      (!*leader || static_cast<uint64_t>((*leader)->create_revision) != term_.load())) {
    StepDown("the leader key is no longer ours");
    return;
  }
  ManageSync();
  bool published = false;
  {
    std::lock_guard lock(mu_);
    published = published_serving_;
  }
  if (!published && (options_.sync_standbys == 0 || standbys_.Ready())) {
    // Calls are admitted before the record says so: the address is published once it answers.
    serving_.store(true);
    if (PublishServing()) {
      std::lock_guard lock(mu_);
      published_serving_ = true;
      leader_seen_.serving = true;
    } else {
      serving_.store(false);
    }
  }
}

bool Coordinator::PublishServing() {
  const std::string leader_key = etcd::LeaderKey(options_.cluster_id);
  int64_t lease = 0;
  {
    std::lock_guard lock(mu_);
    lease = lease_id_;
  }
  etcd::LeaderRecord record{member_id_, options_.advertise, options_.fast_port,
                            options_.http_port, term_.load(), true, options_.fast_local};
  auto put = etcd_->Txn({Compare::CreateRevision(leader_key, Compare::Result::kEqual,
                                                 static_cast<int64_t>(term_.load()))},
                        {TxnOp::Put(leader_key, etcd::EncodeLeaderRecord(record), lease)});
  if (!put.ok() || !put->succeeded) return false;
  GLOG_WARN("HA: serving as the leader of term {} at {} (fast port {})", term_.load(),
            options_.advertise, options_.fast_port);
  return true;
}

bool Coordinator::DesignateSync(const std::string& id, bool required) {
  const std::string leader_key = etcd::LeaderKey(options_.cluster_id);
  auto put = etcd_->Txn({Compare::CreateRevision(leader_key, Compare::Result::kEqual,
                                                 static_cast<int64_t>(term_.load()))},
                        {TxnOp::Put(etcd::SyncKey(options_.cluster_id), id)});
  if (!put.ok() || !put->succeeded) return false;
  standbys_.SetSync(id == member_id_ ? "" : id, required);
  sync_changes_->Inc();
  return true;
}

void Coordinator::ManageSync() {
  const std::vector<StandbySet::Standby> list = standbys_.List();
  const auto now = SteadyClock::now();
  auto alive = [&](const StandbySet::Standby& s) {
    return s.connected && now - s.last_ack < options_.standby_timeout;
  };
  const std::string current = standbys_.sync_id();
  const bool required = standbys_.sync_required();
  if (options_.sync_standbys == 0) {
    // Asynchronous: etcd names the standby furthest along, the one that loses least.
    const StandbySet::Standby* best = nullptr;
    for (const auto& s : list) {
      if (alive(s) && (!best || s.acked > best->acked)) best = &s;
    }
    const std::string want = best ? best->id : member_id_;
    const std::string have = current.empty() ? member_id_ : current;
    if (want != have) (void)DesignateSync(want, false);
    return;
  }
  const auto it = std::find_if(list.begin(), list.end(),
                               [&](const auto& s) { return s.id == current; });
  if (!current.empty() && required && it != list.end() && alive(*it)) {
    std::lock_guard lock(mu_);
    sync_missing_since_ = now;
    return;  // a live synchronous standby: nothing to do
  }
  const bool any_alive = std::any_of(list.begin(), list.end(), alive);
  if (!required) {
    // Serving alone. A standby is back: stop releasing replies (from here on `released` stands
    // still) and give it standby_timeout to catch up with it; a standby named while replies are
    // still released without it could lack one of them.
    std::lock_guard lock(mu_);
    if (!any_alive || now < next_rejoin_) return;
    standbys_.SetSync("", true);
    sync_missing_since_ = now;
    GLOG_WARN("HA: a standby is back: changes wait until it has caught up");
  } else if (!current.empty()) {
    // The synchronous standby is gone or silent. Replies stop being released while we choose: a
    // newcomer must hold every operation released so far.
    GLOG_WARN("HA: synchronous standby {} is gone or silent: choosing another", current);
    standbys_.SetSync("", true);
  }
  const uint64_t released = standbys_.released();  // no reply is released past it meanwhile
  const StandbySet::Standby* best = nullptr;
  for (const auto& s : list) {
    if (alive(s) && s.acked >= released && (!best || s.acked > best->acked)) best = &s;
  }
  if (best) {
    if (DesignateSync(best->id, true)) {
      GLOG_WARN("HA: {} is the synchronous standby (acked seq {})", best->id, best->acked);
      std::lock_guard lock(mu_);
      serving_alone_ = false;
      sync_missing_since_ = now;
    }
    return;
  }
  bool alone = false;
  {
    std::lock_guard lock(mu_);
    if (options_.allow_serving_alone && now - sync_missing_since_ >= options_.standby_timeout) {
      if (!serving_alone_) {
        GLOG_WARN("HA: no synchronous standby for {} ms: serving alone (--allow-serving-alone); "
                  "a failover now may lose the last operations",
                  options_.standby_timeout.count());
      }
      serving_alone_ = alone = true;
      // A standby that could not catch up is given its next chance a while later, not at once.
      next_rejoin_ = now + 5 * options_.standby_timeout;
    }
  }
  if (alone) (void)DesignateSync(member_id_, false);
}

// ---- status and metrics ----

nlohmann::json Coordinator::StatusJson() const {
  nlohmann::json doc;
  std::lock_guard lock(mu_);
  doc["member_id"] = member_id_;
  doc["cluster_id"] = options_.cluster_id;
  // "leader" only while calls are admitted: a leader whose lease ran out serves nothing, even
  // before its coordinator has stepped down (it may be waiting on an unreachable etcd).
  const char* role = "standby";
  if (role_ == Role::kLeader) {
    role = !serving_.load() ? "leader (taking over)"
           : LeaseFresh()   ? "leader"
                            : "leader (lease expired: stepping down)";
  }
  doc["role"] = role;
  doc["term"] = term_.load();
  doc["applied_seq"] = state_->last_seq();
  doc["sync_standbys"] = options_.sync_standbys;
  doc["serving_alone"] = serving_alone_;
  doc["leader"] = {{"id", leader_seen_.id},
                   {"grpc", leader_seen_.grpc},
                   {"term", leader_seen_.term},
                   {"serving", leader_seen_.serving}};
  if (!last_step_down_.empty()) doc["last_step_down"] = last_step_down_;
  if (role_ == Role::kLeader) {
    nlohmann::json standbys = nlohmann::json::array();
    const uint64_t last = state_->last_seq();
    const std::string sync = standbys_.sync_id();
    for (const auto& s : standbys_.List()) {
      standbys.push_back({{"id", s.id},
                          {"grpc", s.advertise},
                          {"connected", s.connected},
                          {"synchronous", s.id == sync && standbys_.sync_required()},
                          {"acked_seq", s.acked},
                          {"lag", last > s.acked ? last - s.acked : 0}});
    }
    doc["standbys"] = std::move(standbys);
  } else {
    const StandbyFollower::Progress p =
        follower_ ? follower_->progress() : StandbyFollower::Progress{};
    doc["following"] = {{"connected", p.connected},
                        {"term", p.term},
                        {"leader_seq", p.leader_last},
                        {"lag", p.leader_last > p.applied ? p.leader_last - p.applied : 0},
                        {"snapshots_loaded", p.snapshots}};
  }
  return doc;
}

void Coordinator::FillClusterStatus(proto::ClusterStatusResponse* out) const {
  out->set_ha(true);
  out->set_cluster_id(options_.cluster_id);
  out->set_member_id(member_id_);
  out->set_address(options_.advertise);
  out->set_term(term_.load());
  const uint64_t last = state_->last_seq();
  out->set_applied_seq(last);
  {
    std::lock_guard lock(mu_);
    out->set_serving_alone(serving_alone_);
  }
  const std::string sync = standbys_.sync_id();
  for (const auto& s : standbys_.List()) {
    proto::StandbyStatus* st = out->add_standbys();
    st->set_id(s.id);
    st->set_address(s.advertise);
    st->set_connected(s.connected);
    st->set_synchronous(s.id == sync && standbys_.sync_required());
    st->set_acked_seq(s.acked);
    st->set_lag(last > s.acked ? last - s.acked : 0);
  }
}

void Coordinator::RegisterMetrics(MetricsRegistry* m) {
  elections_won_ = m->AddCounter("granary_master_ha_elections_won_total",
                                 "elections this master won (failovers to it)");
  step_downs_ = m->AddCounter("granary_master_ha_step_downs_total",
                              "times this master stopped leading");
  sync_changes_ = m->AddCounter("granary_master_ha_sync_standby_changes_total",
                                "synchronous standby designations written to etcd");
  fresh_starts_ = m->AddCounter("granary_master_ha_fresh_starts_total",
                                "terms begun from an empty state (no synchronous standby left)");
  using Series = std::vector<std::pair<Labels, double>>;
  m->AddGaugeCallback("granary_master_ha_leader", "1 while this master serves as the leader",
                      [this] { return Series{{{}, serving_.load() ? 1.0 : 0.0}}; });
  m->AddGaugeCallback("granary_master_ha_term", "the term this master leads (0: a standby)",
                      [this] { return Series{{{}, static_cast<double>(term_.load())}}; });
  m->AddGaugeCallback("granary_master_ha_applied_seq", "last operation applied here",
                      [this] { return Series{{{}, static_cast<double>(state_->last_seq())}}; });
  m->AddGaugeCallback("granary_master_ha_serving_alone",
                      "1 while the leader serves without a synchronous standby",
                      [this] {
                        std::lock_guard lock(mu_);
                        return Series{{{}, serving_alone_ ? 1.0 : 0.0}};
                      });
  m->AddGaugeCallback("granary_master_ha_standby_lag",
                      "operations a standby has not acknowledged (leader's view)", [this] {
                        Series out;
                        const uint64_t last = state_->last_seq();
                        for (const auto& s : standbys_.List()) {
                          if (!s.connected) continue;
                          out.push_back({{{"standby", s.id}},
                                         static_cast<double>(last > s.acked ? last - s.acked : 0)});
                        }
                        return out;
                      });
  m->AddGaugeCallback("granary_master_ha_follower_lag",
                      "operations behind the leader (standby's view)", [this] {
                        const StandbyFollower::Progress p =
        follower_ ? follower_->progress() : StandbyFollower::Progress{};
                        return Series{{{}, static_cast<double>(
                                               p.leader_last > p.applied ? p.leader_last - p.applied
                                                                         : 0)}};
                      });
}

}  // namespace granary::master::ha
