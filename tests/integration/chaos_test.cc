// The chaos test: a master and 4 nodes as real processes, several client processes
// (granary-test-worker chaos, tests/tools/chaos_worker.h) doing a mixed load, and meanwhile a
// seeded schedule of faults: nodes SIGKILLed and restarted, nodes SIGSTOPped for longer than the
// client TTL and resumed, the master SIGKILLed and restarted, client processes SIGKILLed in the
// middle of a put.
//
// What must hold:
// - Every read that answered OK returned byte-exact content of a version some writer attempted
//   for that key (values are verifiable from the key: tests/tools/chaos_value.h), never a version
//   older than one its own writer saw upserted or removed. A miss or an error is always allowed.
// - No worker crashes; the store serves puts and gets again once the faults stop.
// - After remove_all, used bytes return to 0 on every segment (within the master's quarantine,
//   release and reservation timeouts).
// Reproducing: the seed and the timeline of faults (wall-clock ms, as in the workers' reports)
// are printed; GRANARY_CHAOS_SEED=<seed> replays the same schedule (timing still varies).
// GRANARY_IT_KEEP_TMP=1 keeps the workers' attempt/read logs.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "../tools/chaos_value.h"
#include "ha_fixture.h"
#include "store_fixture.h"

namespace granary::it {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr size_t kNodes = 4;
constexpr uint64_t kSegmentSize = 96 * MiB;
constexpr int kKeysPerWorker = 40;
constexpr int kThreadsPerWorker = 2;
// Workers w0, w1 use shared memory, w2, w3 TCP; r0, r1 replace the ones killed mid-put.
const std::vector<std::string> kFirstWorkers = {"w0", "w1", "w2", "w3"};
const std::vector<std::string> kSpareWorkers = {"r0", "r1", "r2"};

int64_t WallMs() {
  return std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Sleep(Millis d) { std::this_thread::sleep_for(d); }

uint64_t SeedFromEnv() {
  if (const char* s = std::getenv("GRANARY_CHAOS_SEED"); s != nullptr && *s) {
    return std::strtoull(s, nullptr, 10);
  }
  return std::random_device{}() ^ (static_cast<uint64_t>(WallMs()) << 16);
}

// The last complete line of a file ("" if none), read from its tail only.
std::string LastLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 1024);
  in.seekg(from);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  if (tail.empty() || tail.back() != '\n') return "";
  tail.pop_back();
  size_t nl = tail.rfind('\n');
  return nl == std::string::npos ? (from == 0 ? tail : "") : tail.substr(nl + 1);
}

std::vector<std::string> Split(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string Join(const std::vector<std::string>& fields) {
  std::string out;
  for (const auto& f : fields) out += (out.empty() ? "" : " ") + f;
  return out;
}

struct Worker {
  std::string id;
  bool shm = true;
  std::unique_ptr<ChildProcess> proc;
  bool killed_by_test = false;
};

// One attempted put: "P <ms> <key> <version> <length> <replicas> <op>".
struct Attempt {
  int64_t ms = 0;
  uint64_t length = 0;
  std::string op;
  bool ended = false;
  int code = 0;
};
using AttemptKey = std::pair<std::string, uint64_t>;  // (key, version)

class ChaosTest : public StoreTest {
 protected:
  enum Fault {
    kKillNode, kKillTwoNodes, kStopNode, kKillMaster, kStopAcrossMaster, kKillClient,
    kStopLeader, kKillStandby  // HA only
  };
  // The load, the faults of `schedule` in a seeded order, then every check (the test's body).
  void RunChaos(std::vector<Fault> schedule);

  void SetUp() override {
    seed_ = SeedFromEnv();
    rng_.seed(seed_);
    t0_ = SteadyClock::now();
    Note("chaos seed " + std::to_string(seed_) + " (rerun with GRANARY_CHAOS_SEED=" +
         std::to_string(seed_) + ")");
  }

  void TearDown() override {
    for (auto& w : workers_) {
      if (w.proc) w.proc->KillAndReap();
    }
    for (size_t i = 0; i < NodeCount(); ++i) Node(i).Kill(SIGCONT);
    if (HasFailure()) std::fprintf(stderr, "%s\n", Evidence().c_str());
    if (HasFailure() && ha_) std::fprintf(stderr, "%s\n", ha_->Logs().c_str());
    StoreTest::TearDown();
  }

  // The store under test: StoreTest's cluster_ (one master), or an HA cluster (StartHa).
  NodeProcess& Node(size_t i) { return ha_ ? ha_->node(i) : cluster_.node(i); }
  size_t NodeCount() { return ha_ ? ha_->node_count() : cluster_.node_count(); }
  void KillNodeAt(size_t i) {
    if (ha_) {
      ha_->KillNode(i);
    } else {
      cluster_.KillNode(i);
    }
  }
  ::testing::AssertionResult RestartNodeAt(size_t i) {
    return ha_ ? ha_->RestartNode(i) : cluster_.RestartNode(i);
  }
  bool AllMounted(Millis timeout) {
    return ha_ ? ha_->WaitForAllNodesMounted(timeout) : cluster_.WaitForAllNodesMounted(timeout);
  }
  std::unique_ptr<Client> NewClient(bool shm) {
    return ha_ ? ha_->MakeClient(shm) : cluster_.MakeClient(shm);
  }
  std::string MasterAddress() { return ha_ ? ha_->address() : cluster_.master_address(); }
  std::string MasterStatus() {
    if (!ha_) return HttpGet(cluster_.master().http_port(), "/status").body;
    const int leader = ha_->LeaderIndex();
    return leader < 0 ? "(no leader)" : HttpGet(ha_->master(leader).http_port(), "/status").body;
  }
  std::string AllLogs() { return ha_ ? ha_->Logs() : cluster_.Logs(); }

  // Three HA masters (one etcd) instead of one master; workers find the leader through etcd.
  ::testing::AssertionResult StartHa(std::vector<std::string> master_flags) {
    ha_ = std::make_unique<HaCluster>();
    ::setenv("GRANARY_CLUSTER_ID", ha_->cluster_id().c_str(), 1);  // for the worker processes
    return ha_->Start(3, kNodes, kSegmentSize, std::move(master_flags));
  }

  // A line of the timeline: seconds since the start, wall-clock ms (the workers' time base).
  void Note(const std::string& what) {
    char head[64];
    std::snprintf(head, sizeof head, "[%6.1fs %lld] ",
                  std::chrono::duration<double>(SteadyClock::now() - t0_).count(),
                  static_cast<long long>(WallMs()));
    timeline_ += head + what + "\n";
    std::fprintf(stderr, "chaos: %s%s\n", head, what.c_str());
  }

  std::string WorkerFile(const std::string& id, const std::string& ext) const {
    return dir_.File(id + ext);
  }

  std::vector<std::string> AllWorkerIds() const {
    std::vector<std::string> ids = kFirstWorkers;
    ids.insert(ids.end(), kSpareWorkers.begin(), kSpareWorkers.end());
    return ids;
  }

  std::string JoinIds() const {
    std::string s;
    for (const auto& id : AllWorkerIds()) s += (s.empty() ? "" : ",") + id;
    return s;
  }

  ::testing::AssertionResult StartWorker(const std::string& id, bool shm) {
    Worker w;
    w.id = id;
    w.shm = shm;
    w.proc = std::make_unique<ChildProcess>();
    std::vector<std::string> args = {"chaos",     "--master",  MasterAddress(),
                                     "--id",      id,          "--dir",
                                     dir_.path(), "--read-ids", JoinIds(),
                                     "--seconds", "200",       "--threads",
                                     std::to_string(kThreadsPerWorker),
                                     "--keys",    std::to_string(kKeysPerWorker),
                                     "--seed",    std::to_string(seed_ + workers_.size() + 1)};
    if (!shm) args.push_back("--no-shm");
    std::string error;
    if (!w.proc->Start(BinaryPath("granary-test-worker"), args, WorkerFile(id, ".log"), &error)) {
      return ::testing::AssertionFailure() << "cannot start worker " << id << ": " << error;
    }
    Note("worker " + id + " started (" + (shm ? "shm" : "tcp") + ", pid " +
         std::to_string(w.proc->pid()) + ")");
    workers_.push_back(std::move(w));
    return ::testing::AssertionSuccess();
  }

  // Workers that exited on their own (not killed by the test) while the load should be running.
  ::testing::AssertionResult WorkersAlive() {
    for (auto& w : workers_) {
      if (w.killed_by_test || w.proc->Running()) continue;
      return ::testing::AssertionFailure()
             << "worker " << w.id << " exited during the chaos: "
             << w.proc->exit_status()->ToString() << "\n" << w.proc->LogContents(8192);
    }
    return ::testing::AssertionSuccess();
  }

  double Uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  Millis UniformMs(int lo, int hi) {
    return Millis(std::uniform_int_distribution<int>(lo, hi)(rng_));
  }
  size_t PickNode() { return rng_() % NodeCount(); }

  ::testing::AssertionResult WaitMounted(const std::string& after) {
    if (!AllMounted(Millis(15'000))) {
      return ::testing::AssertionFailure() << "not every node's segment is mounted 15 s after "
                                           << after;
    }
    Note("all " + std::to_string(NodeCount()) + " segments mounted again");
    return ::testing::AssertionSuccess();
  }

  // ---- faults ----

  ::testing::AssertionResult KillNodes(size_t count) {
    std::vector<size_t> victims;
    while (victims.size() < count) {
      size_t i = PickNode();
      if (std::find(victims.begin(), victims.end(), i) == victims.end()) victims.push_back(i);
    }
    for (size_t i : victims) {
      Note("SIGKILL node " + Node(i).name() + " (pid " +
           std::to_string(Node(i).process().pid()) + ")");
      KillNodeAt(i);
    }
    Sleep(UniformMs(300, 2500));
    for (size_t i : victims) {
      if (auto r = RestartNodeAt(i); !r) return r;
      Note("node " + Node(i).name() + " restarted (pid " +
           std::to_string(Node(i).process().pid()) + ")");
    }
    return WaitMounted("the node restart");
  }

  // SIGSTOP for longer than the client TTL (2 s): the master declares the node dead and drops
  // its replicas; once resumed, the node remounts (new token, new memory: the mount fence).
  ::testing::AssertionResult StopNode() {
    size_t i = PickNode();
    Millis stopped = UniformMs(3000, 4500);
    Note("SIGSTOP node " + Node(i).name() + " for " + std::to_string(stopped.count()) +
         " ms");
    Node(i).Kill(SIGSTOP);
    Sleep(stopped);
    Node(i).Kill(SIGCONT);
    Note("SIGCONT node " + Node(i).name());
    return WaitMounted("SIGCONT");
  }

  // HA: the leader, or a standby, killed with -9 and started again (it rejoins as a standby).
  ::testing::AssertionResult KillHaMaster(bool leader) {
    int victim = ha_->LeaderIndex();
    if (victim < 0) return ::testing::AssertionFailure() << "no leader to kill";
    if (!leader) victim = (victim + 1 + static_cast<int>(rng_() % 2)) % ha_->master_count();
    Note(std::string("SIGKILL ") + (leader ? "the leader" : "a standby") + ", master " +
         std::to_string(victim) + " (pid " + std::to_string(ha_->master(victim).process().pid()) +
         ")");
    ha_->master(victim).process().KillAndReap();
    if (leader) {
      const int next = ha_->WaitForLeader(Millis(10'000), victim);
      if (next < 0) return ::testing::AssertionFailure() << "no new leader within 10 s";
      Note("master " + std::to_string(next) + " leads");
    }
    Sleep(UniformMs(200, 1500));
    if (auto r = ha_->RestartMaster(victim); !r) return r;
    Note("master " + std::to_string(victim) + " restarted: a standby again");
    return WaitMounted("the failover");
  }

  // HA: the leader SIGSTOPped past its lease (a standby takes over), then resumed: it must have
  // stepped down and serve nothing beside the new leader.
  ::testing::AssertionResult StopLeader() {
    const int victim = ha_->LeaderIndex();
    if (victim < 0) return ::testing::AssertionFailure() << "no leader to stop";
    Note("SIGSTOP the leader, master " + std::to_string(victim));
    ha_->master(victim).process().Kill(SIGSTOP);
    const int next = ha_->WaitForLeader(Millis(10'000), victim);
    Sleep(UniformMs(300, 1500));
    ha_->master(victim).process().Kill(SIGCONT);
    if (next < 0) return ::testing::AssertionFailure() << "no new leader within 10 s";
    Note("master " + std::to_string(next) + " leads; SIGCONT master " + std::to_string(victim));
    if (!ha_->WaitForRole(victim, "standby", Millis(10'000))) {
      return ::testing::AssertionFailure() << "the resumed leader did not rejoin as a standby";
    }
    return WaitMounted("the failover");
  }

  ::testing::AssertionResult KillMaster() {
    if (ha_) return KillHaMaster(/*leader=*/true);
    Note("SIGKILL master (pid " + std::to_string(cluster_.master().process().pid()) + ")");
    cluster_.master().Stop(SIGKILL, Millis(5000));
    Sleep(UniformMs(200, 1500));
    if (auto r = cluster_.RestartMaster(); !r) return r;
    Note("master restarted (pid " + std::to_string(cluster_.master().process().pid()) +
         "): its state is gone, nodes remount");
    return WaitMounted("the master restart");
  }

  // A node frozen while the master restarts: it learns of the new master only once resumed.
  ::testing::AssertionResult StopNodeAcrossMasterRestart() {
    size_t i = PickNode();
    if (ha_) {
      // A node frozen across a failover: resumed, it finds the new leader, which knows its mount.
      Note("SIGSTOP node " + Node(i).name() + ", then fail the leader over under it");
      Node(i).Kill(SIGSTOP);
      auto r = KillHaMaster(/*leader=*/true);
      Node(i).Kill(SIGCONT);
      Note("SIGCONT node " + Node(i).name());
      if (!r) return r;
      return WaitMounted("SIGCONT after the failover");
    }
    Note("SIGSTOP node " + Node(i).name() + ", then restart the master under it");
    Node(i).Kill(SIGSTOP);
    Sleep(UniformMs(300, 800));
    Note("SIGKILL master (pid " + std::to_string(cluster_.master().process().pid()) + ")");
    cluster_.master().Stop(SIGKILL, Millis(5000));
    Sleep(UniformMs(200, 800));
    if (auto r = cluster_.RestartMaster(); !r) {
      Node(i).Kill(SIGCONT);
      return r;
    }
    Note("master restarted (pid " + std::to_string(cluster_.master().process().pid()) + ")");
    Sleep(UniformMs(2500, 3500));
    Node(i).Kill(SIGCONT);
    Note("SIGCONT node " + Node(i).name());
    return WaitMounted("SIGCONT after the master restart");
  }

  // SIGKILL a worker while one of its puts is in flight: its attempt log shows the put started
  // ("P" without its "E", preferably a large one) and the master shows the key PROCESSING, i.e.
  // between put-start and put-end. Then a spare worker takes its place.
  ::testing::AssertionResult KillClientMidPut() {
    std::vector<size_t> live;
    for (size_t k = 0; k < workers_.size(); ++k) {
      if (!workers_[k].killed_by_test && workers_[k].proc->Running()) live.push_back(k);
    }
    if (live.empty() || next_spare_ >= kSpareWorkers.size()) {
      return ::testing::AssertionFailure() << "no worker left to kill";
    }
    Worker& w = workers_[live[rng_() % live.size()]];
    auto observer = NewClient(false);
    if (!observer) return ::testing::AssertionFailure() << "no client";
    const std::string attempts = WorkerFile(w.id, ".attempts");
    const auto until = SteadyClock::now() + Millis(8000);
    const auto prefer_large_until = SteadyClock::now() + Millis(4000);
    std::vector<std::string> put;  // the P line's fields
    bool processing = false;
    while (SteadyClock::now() < until) {
      put = Split(LastLine(attempts));
      const bool late = SteadyClock::now() > prefer_large_until;
      if (put.size() != 7 || put[0] != "P" || (std::stoull(put[4]) < 512 * KiB && !late)) {
        put.clear();
        Sleep(Millis(1));
        continue;
      }
      if (late) break;  // any put in flight will do: kill now, before it ends
      // Started by the worker; kill once the master has its put-start (bounded: it may end).
      for (int i = 0; i < 50 && !processing; ++i) {
        auto stat = observer->Stat(put[2]);
        processing = stat.ok() && stat->state.find("PROCESSING") != std::string::npos;
        if (LastLine(attempts) != Join(put)) break;  // that put ended, or another began
      }
      if (processing) break;
      put.clear();
    }
    w.proc->Kill(SIGKILL);
    w.killed_by_test = true;
    w.proc->Wait(Millis(5000));
    bool mid_put = false;
    std::string state;
    if (put.size() == 7) {
      // Mid-put if the put's "E" line never got written.
      mid_put = true;
      std::ifstream in(attempts);
      for (std::string l; std::getline(in, l);) {
        auto f = Split(l);
        if (f.size() == 5 && f[0] == "E" && f[2] == put[2] && f[3] == put[3]) mid_put = false;
      }
      auto stat = observer->Stat(put[2]);
      state = stat.ok() ? stat->state + " (" + std::to_string(stat->size) + " bytes)"
                        : stat.status().ToString();
    }
    if (mid_put) ++mid_put_kills_;
    Note("SIGKILL worker " + w.id +
         (mid_put ? " mid-put" + std::string(processing ? " (master showed it PROCESSING)" : "") +
                        ": " + put[6] + " of " + put[2] + " v" + put[3] + " (" + put[4] +
                        " bytes, " + put[5] + " replicas); the key is now " + state
                  : " (missed: no put was in flight)"));
    const bool shm = w.shm;
    return StartWorker(kSpareWorkers[next_spare_++], shm);
  }

  // Every put attempt of `key` from any worker within [from_ms, to_ms], as "P"/"E" lines.
  std::string KeyHistory(const std::string& key, int64_t from_ms, int64_t to_ms) const {
    std::vector<std::pair<int64_t, std::string>> lines;
    for (const auto& id : AllWorkerIds()) {
      std::ifstream in(WorkerFile(id, ".attempts"));
      for (std::string l; std::getline(in, l);) {
        auto f = Split(l);
        if (f.size() < 4 || f[2] != key) continue;
        int64_t ms = std::stoll(f[1]);
        if (ms >= from_ms && ms <= to_ms) lines.emplace_back(ms, id + ": " + l);
      }
    }
    std::sort(lines.begin(), lines.end());
    std::string out;
    const size_t kMaxLines = 24;
    for (size_t i = 0; i < lines.size() && i < kMaxLines; ++i) out += "      " + lines[i].second + "\n";
    if (lines.size() > kMaxLines) {
      out += "      [" + std::to_string(lines.size() - kMaxLines) + " more]\n";
    }
    return out.empty() ? "      (no put of this key in that window)\n" : out;
  }

  // The workers' CHECKSUM_MISMATCH diagnoses (allowed: reported as errors, not as data), each
  // with what the writers did to that key in the seconds before.
  std::string MismatchDiagnoses() const {
    std::string out;
    for (const auto& id : AllWorkerIds()) {
      std::ifstream in(WorkerFile(id, ".diag"));
      for (std::string l; std::getline(in, l);) {
        out += l + "\n";
        // "=== <id> (<mode>) <key>: CHECKSUM_MISMATCH in a N-key get started at <ms> ms,
        //  answered after <d> ms ..."
        auto f = Split(l);
        if (f.size() < 16 || f[0] != "===") continue;
        std::string key = f[3].substr(0, f[3].size() - 1);
        int64_t ms = std::stoll(f[11]);
        int64_t took = std::stoll(f[15]);
        out += "    puts (P/E) and removes (R) of " + key +
               " from 0.2 s before the get to 1.5 s after it started (the lease is 1 s):\n" +
               KeyHistory(key, ms - 200, std::min(ms + took, ms + 1500));
      }
    }
    return out;
  }

  // ---- checks after the chaos ----

  // Every (key, version, length) a worker read and verified was attempted by some writer.
  ::testing::AssertionResult ReadsWereWritten(size_t* reads_checked) {
    std::map<AttemptKey, Attempt> attempts;
    for (const auto& id : AllWorkerIds()) {
      std::ifstream in(WorkerFile(id, ".attempts"));
      for (std::string line; std::getline(in, line);) {
        auto f = Split(line);
        if (f.size() == 7 && f[0] == "P") {
          Attempt& a = attempts[{f[2], std::stoull(f[3])}];
          a.ms = std::stoll(f[1]);
          a.length = std::stoull(f[4]);
          a.op = f[6];
        } else if (f.size() == 5 && f[0] == "E") {
          Attempt& a = attempts[{f[2], std::stoull(f[3])}];
          a.ended = true;
          a.code = std::stoi(f[4]);
        }
      }
    }
    attempts_ = attempts;
    *reads_checked = 0;
    for (const auto& id : AllWorkerIds()) {
      std::ifstream in(WorkerFile(id, ".reads"));
      for (std::string line; std::getline(in, line);) {
        auto f = Split(line);
        if (f.size() != 4 || f[0] != "G") continue;
        ++*reads_checked;
        auto it = attempts.find({f[1], std::stoull(f[2])});
        if (it == attempts.end()) {
          return ::testing::AssertionFailure()
                 << "worker " << id << " read " << f[1] << " version " << f[2]
                 << " but no writer ever attempted that version";
        }
        if (it->second.length != std::stoull(f[3])) {
          return ::testing::AssertionFailure()
                 << "worker " << id << " read " << f[1] << " version " << f[2] << " with "
                 << f[3] << " bytes, but its writer put " << it->second.length << " bytes";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  // A fresh client reads every key any worker could have written: misses, errors, or verified
  // bytes of an attempted version.
  ::testing::AssertionResult FinalReadsVerify(size_t* verified) {
    auto client = NewClient(true);
    if (!client) return ::testing::AssertionFailure() << "no client";
    *verified = 0;
    std::vector<std::string> keys;
    for (const auto& id : AllWorkerIds()) {
      for (int j = 0; j < kKeysPerWorker; ++j) keys.push_back("chaos/" + id + "/k" + std::to_string(j));
    }
    for (size_t from = 0; from < keys.size(); from += 16) {
      std::vector<std::string> batch(keys.begin() + from,
                                     keys.begin() + std::min(keys.size(), from + 16));
      auto got = client->BatchGet(batch);
      for (size_t i = 0; i < batch.size(); ++i) {
        if (!got[i].ok()) continue;
        chaos::Verdict v = chaos::VerifyValue(batch[i], *got[i]);
        if (!v.ok) {
          return ::testing::AssertionFailure()
                 << "final read of " << batch[i] << " returned wrong bytes: " << v.what;
        }
        if (!attempts_.count({batch[i], v.version})) {
          return ::testing::AssertionFailure() << "final read of " << batch[i] << " returned version "
                                               << v.version << ", never attempted";
        }
        ++*verified;
      }
    }
    return ::testing::AssertionSuccess();
  }

  // The store takes and serves new objects after the chaos (bounded retries: a node may still be
  // remounting).
  ::testing::AssertionResult ServesAgain() {
    auto client = NewClient(false);
    if (!client) return ::testing::AssertionFailure() << "no client";
    ReplicateConfig two;
    two.replica_num = 2;
    for (int i = 0; i < 6; ++i) {
      const std::string key = "chaos/after/" + std::to_string(i);
      const auto value = chaos::MakeValue(key, 1, static_cast<uint32_t>((i + 1) * 300 * KiB + i));
      Status put;
      auto deadline = SteadyClock::now() + Millis(10'000);
      do {
        put = client->Put(key, value, two);
        if (put.ok()) break;
        Sleep(Millis(200));
      } while (SteadyClock::now() < deadline);
      if (!put.ok()) return ::testing::AssertionFailure() << "put " << key << ": " << put.ToString();
      auto got = client->Get(key);
      if (!got.ok()) {
        return ::testing::AssertionFailure() << "get " << key << ": " << got.status().ToString();
      }
      if (*got != value) return ::testing::AssertionFailure() << "wrong bytes for " << key;
    }
    return ::testing::AssertionSuccess();
  }

  std::string SegmentsText(Client& client) {
    auto segments = client.ListSegments();
    if (!segments.ok()) return "ListSegments: " + segments.status().ToString();
    std::string out;
    for (const auto& s : *segments) {
      out += "  " + s.name + ": used " + std::to_string(s.used_bytes) + " of " +
             std::to_string(s.size) + ", free " + std::to_string(s.free_bytes) + ", replicas " +
             std::to_string(s.replicas) + "\n";
    }
    return out;
  }

  // A worker's wrong-read reports, each with the key's puts and removes while the read ran.
  std::string WrongReports(const std::string& id) const {
    std::string out;
    std::ifstream in(WorkerFile(id, ".wrong"));
    for (std::string l; std::getline(in, l) && out.size() < 32 * 1024;) {
      out += l + "\n";
      // "=== <id> (<mode>) <op> of <key> started at <ms> ms, answered OK at <ms> ms with ..."
      auto f = Split(l);
      if (f.size() < 14 || f[0] != "===") continue;
      out += "    puts (P/E) and removes (R) of " + f[5] +
             " from 0.2 s before the read to 1.5 s after it started (the lease is 1 s):\n" +
             KeyHistory(f[5], std::stoll(f[8]) - 200, std::stoll(f[8]) + 1500);
    }
    return out;
  }

  // Everything a failure needs: the timeline, the workers' reports and their logs' tails.
  std::string Evidence() {
    std::string out = "===== chaos timeline (seed " + std::to_string(seed_) + ") =====\n" + timeline_;
    if (std::string d = MismatchDiagnoses(); !d.empty()) {
      out += "===== CHECKSUM_MISMATCH diagnoses =====\n" + d;
    }
    for (const auto& id : AllWorkerIds()) {
      std::string wrong = WrongReports(id);
      if (!wrong.empty()) out += "===== " + id + ".wrong =====\n" + wrong;
      std::string log = ReadFile(WorkerFile(id, ".log"));
      if (log.empty()) continue;
      if (log.size() > 4096) log = "[...]" + log.substr(log.size() - 4096);
      out += "===== worker " + id + " log =====\n" + log;
    }
    return out;
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  SteadyClock::time_point t0_;
  std::string timeline_;
  TempDir dir_{"granary-it-chaos"};
  std::vector<Worker> workers_;
  size_t next_spare_ = 0;
  int mid_put_kills_ = 0;
  std::unique_ptr<HaCluster> ha_;  // set by StartHa: the HA store under test
  std::map<AttemptKey, Attempt> attempts_;
};

// The summary counters of every worker that printed one (workers killed mid-put did not).
std::map<std::string, uint64_t> SumSummaries(const std::vector<std::string>& logs,
                                             std::map<std::string, uint64_t>* codes) {
  std::map<std::string, uint64_t> sum;
  for (const auto& log : logs) {
    size_t at = log.find("CHAOS-SUMMARY ");
    if (at == std::string::npos) continue;
    std::string line = log.substr(at, log.find('\n', at) - at);
    for (const auto& field : Split(line)) {
      size_t eq = field.find('=');
      if (eq == std::string::npos) continue;
      std::string name = field.substr(0, eq), value = field.substr(eq + 1);
      if (name == "id") continue;
      if (name == "codes") {
        std::istringstream in(value);
        for (std::string item; std::getline(in, item, ',');) {
          size_t colon = item.rfind(':');
          if (colon != std::string::npos) {
            (*codes)[item.substr(0, colon)] += std::stoull(item.substr(colon + 1));
          }
        }
        continue;
      }
      if (name == "max_verified") {
        sum[name] = std::max<uint64_t>(sum[name], std::stoull(value));
      } else {
        sum[name] += std::stoull(value);
      }
    }
  }
  return sum;
}

// The fixture's Fault list and RunChaos are defined above the tests.
TEST_F(ChaosTest, MixedLoadUnderKillsStopsAndRestartsNeverReturnsWrongBytes) {
  // A SIGKILLed worker's reserved space stays held for its lease, then quarantined: a 3 s lease
  // lets remove_all empty the segments in time (and makes leases end mid-run, under the faults).
  ASSERT_TRUE(cluster_.Start(kNodes, kSegmentSize,
                             {{"--write-quarantine", "2s"}, {"--reservation-ttl", "3s"}}));
  RunChaos({kKillNode, kKillNode, kKillTwoNodes, kStopNode, kStopNode, kKillMaster, kKillMaster,
            kStopAcrossMaster, kKillClient, kKillClient});
}

// The same load and checks against three HA masters: the master faults are failovers (the leader
// killed with -9 or paused past its lease, a standby killed), which must lose nothing acknowledged
// and read nothing wrong.
TEST_F(ChaosTest, MixedLoadUnderFailoversNeverReturnsWrongBytes) {
  ASSERT_TRUE(StartHa({"--write-quarantine", "2s", "--reservation-ttl", "3s"}));
  RunChaos({kKillNode, kKillTwoNodes, kStopNode, kKillMaster, kKillMaster, kStopLeader,
            kKillStandby, kStopAcrossMaster, kKillClient, kKillClient});
}

void ChaosTest::RunChaos(std::vector<Fault> schedule) {
  const auto test_start = SteadyClock::now();
  Note(std::string(ha_ ? "three HA masters" : "master") + " and " + std::to_string(kNodes) +
       " nodes of " + std::to_string(kSegmentSize / MiB) + " MiB up; master at " +
       MasterAddress());

  for (size_t k = 0; k < kFirstWorkers.size(); ++k) {
    ASSERT_TRUE(StartWorker(kFirstWorkers[k], /*shm=*/k < 2));
  }
  // Load is flowing: every worker attempted a put.
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const auto& id : kFirstWorkers) {
          if (ReadFile(WorkerFile(id, ".attempts")).empty()) return false;
        }
        return true;
      },
      Millis(20'000)))
      << "workers did not start putting";
  Sleep(Millis(2000));

  // The schedule: every kind of fault, in a seeded order, a few seconds apart.
  std::shuffle(schedule.begin(), schedule.end(), rng_);
  for (Fault f : schedule) {
    ASSERT_TRUE(WorkersAlive());
    ::testing::AssertionResult done = ::testing::AssertionSuccess();
    switch (f) {
      case kKillNode: done = KillNodes(1); break;
      case kKillTwoNodes: done = KillNodes(2); break;
      case kStopNode: done = StopNode(); break;
      case kKillMaster: done = KillMaster(); break;
      case kStopAcrossMaster: done = StopNodeAcrossMasterRestart(); break;
      case kKillClient: done = KillClientMidPut(); break;
      case kStopLeader: done = StopLeader(); break;
      case kKillStandby: done = KillHaMaster(/*leader=*/false); break;
    }
    ASSERT_TRUE(done);
    Sleep(UniformMs(2000, 4500));
  }
  ASSERT_TRUE(WorkersAlive());
  EXPECT_GE(mid_put_kills_, 1) << "no client was killed while a put was in flight";
  Note("faults done; load continues on a healthy cluster");
  Sleep(Millis(4000));

  // Stop the load: every worker finishes its operation in flight and exits.
  dir_.WriteFile("stop", "");
  Note("stop file written");
  std::vector<std::string> logs;
  for (auto& w : workers_) {
    if (w.killed_by_test) continue;
    auto status = w.proc->Wait(Millis(30'000));
    ASSERT_TRUE(status.has_value()) << "worker " << w.id << " did not stop within 30 s";
    EXPECT_TRUE(status->Succeeded())
        << "worker " << w.id << " " << status->ToString()
        << (status->exited && status->code == 4 ? ": it read wrong bytes (see " + w.id + ".wrong)"
                                                : "");
    logs.push_back(ReadFile(WorkerFile(w.id, ".log")));
  }
  const auto load_stopped = SteadyClock::now();
  Note("workers stopped");
  for (const auto& id : AllWorkerIds()) {
    if (std::string wrong = WrongReports(id); !wrong.empty()) {
      ADD_FAILURE() << "worker " << id << " read wrong bytes (timeline below):\n" << wrong;
    }
  }

  // The counters: the load did real work through every path.
  std::map<std::string, uint64_t> codes;
  auto sum = SumSummaries(logs, &codes);
  std::string counters, code_text;
  for (const auto& [k, v] : sum) counters += " " + k + "=" + std::to_string(v);
  for (const auto& [k, v] : codes) code_text += " " + k + "=" + std::to_string(v);
  Note("totals:" + counters);
  Note("outcomes:" + code_text);
  EXPECT_EQ(sum["wrong"], 0u);
  EXPECT_GE(sum["get_ok"], 200u) << "too few verified reads for the test to mean anything";
  EXPECT_GE(sum["put_ok"] + sum["upsert_ok"], 200u) << "too few puts succeeded";
  EXPECT_GE(sum["upsert_ok"], 20u);
  EXPECT_GE(sum["batch_gets"], 20u);
  EXPECT_GE(sum["remove_ok"], 20u);
  EXPECT_GE(sum["max_verified"], 2 * MiB) << "no large object was read back";

  // The checksum is the last line of defence, not the design: with epochs, leases and quarantine
  // no replica may hold bytes its checksum does not certify, so a mismatch is a fencing bug.
  EXPECT_EQ(sum["checksum_mismatch"], 0u)
      << "reads answered CHECKSUM_MISMATCH: a replica held bytes its checksum did not certify:\n"
      << MismatchDiagnoses();

  size_t reads_checked = 0;
  EXPECT_TRUE(ReadsWereWritten(&reads_checked));
  Note(std::to_string(reads_checked) + " distinct (key, version) reads checked against " +
       std::to_string(attempts_.size()) + " attempted puts");

  ASSERT_TRUE(WaitMounted("the load stopped"));
  size_t final_verified = 0;
  EXPECT_TRUE(FinalReadsVerify(&final_verified));
  Note("final pass: " + std::to_string(final_verified) + " keys read back and verified");
  EXPECT_TRUE(ServesAgain());
  Note("the store serves new puts and gets");

  // remove_all, then used bytes must return to 0 on every segment. Read leases (1 s), unfinished
  // puts of killed writers (release timeout 3 s), reservations of killed writers or failed copies
  // (lease 3 s) and revoked writes (write quarantine 2 s) hold space a while: wait out the
  // longest before remove_all, then give the sweeps time.
  auto client = NewClient(false);
  ASSERT_NE(client, nullptr);
  Sleep(std::max(Millis(0), Millis(3500) - std::chrono::duration_cast<Millis>(
                                               SteadyClock::now() - load_stopped)));
  auto removed = client->RemoveAll(false);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  Note("remove_all removed " + std::to_string(*removed) + " objects");
  bool empty = WaitUntil(
      [&] {
        auto segments = client->ListSegments();
        if (!segments.ok() || segments->size() != kNodes) return false;
        for (const auto& s : *segments) {
          if (s.used_bytes != 0) return false;
        }
        return true;
      },
      Millis(20'000), Millis(200));
  std::string segments_now = SegmentsText(*client);
  Note("segments after remove_all:\n" + segments_now);
  if (!empty) {
    auto left = client->QueryByRegex("", 20);
    std::string objects;
    if (left.ok()) {
      for (const auto& o : *left) objects += " " + o.key + "(" + std::to_string(o.size) + ")";
    }
    ADD_FAILURE() << "used bytes did not return to 0 on every segment within 20 s of remove_all:\n"
                  << segments_now << "objects still listed:" << (objects.empty() ? " none" : objects)
                  << "\nmaster /status: " << MasterStatus();
  }
  Note("done in " +
       std::to_string(std::chrono::duration_cast<Millis>(SteadyClock::now() - test_start).count()) +
       " ms");
  std::printf("%s", timeline_.c_str());
}

}  // namespace
}  // namespace granary::it
