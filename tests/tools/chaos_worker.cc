// The chaos test's load-generating client process; see chaos_worker.h.
#include "chaos_worker.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "chaos_value.h"
#include "granary/client.h"

namespace granary::chaos {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitRpc = 3;
constexpr int kExitWrongBytes = 4;
constexpr int kMaxReports = 20;
constexpr int kMaxDiagnoses = 10;

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// An append-only file written one whole line per write(2): lines of concurrent threads never
// interleave, and what was written survives a SIGKILL of this process.
class LineFile {
 public:
  explicit LineFile(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {}
  ~LineFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  void Write(const std::string& line) {
    if (fd_ >= 0) (void)!::write(fd_, line.data(), line.size());
  }

 private:
  int fd_;
};

// Per own key; touched only by the key's owner thread.
struct OwnKey {
  uint64_t next_version = 1;  // versions 1..next_version-1 were attempted
  uint64_t floor = 0;         // a read of this key must return a version >= floor (or miss)
};

struct Check {
  bool own = false;  // floor and next_version are meaningful (the reading thread owns the key)
  uint64_t floor = 0;
  uint64_t next_version = 0;
};

class Worker {
 public:
  Worker(const WorkerOptions& o, Client* client)
      : o_(o),
        client_(client),
        attempts_(o.dir + "/" + o.id + ".attempts"),
        reads_(o.dir + "/" + o.id + ".reads"),
        wrong_(o.dir + "/" + o.id + ".wrong"),
        diag_(o.dir + "/" + o.id + ".diag"),
        own_(static_cast<size_t>(o.keys)),
        start_(std::chrono::steady_clock::now()) {
    for (int j = 0; j < o.keys; ++j) universe_.push_back(KeyOf(o.id, j));
    for (const auto& other : o.read_ids) {
      if (other == o.id) continue;
      for (int j = 0; j < o.keys; ++j) universe_.push_back(KeyOf(other, j));
    }
  }

  static std::string KeyOf(const std::string& id, int j) {
    return "chaos/" + id + "/k" + std::to_string(j);
  }

  void Run() {
    std::vector<std::thread> threads;
    for (int t = 0; t < o_.threads; ++t) threads.emplace_back([this, t] { Loop(t); });
    for (auto& th : threads) th.join();
  }

  bool AnyWrong() const { return wrong_count_.load() > 0; }

  void PrintSummary() {
    std::string codes;
    {
      std::lock_guard lock(mu_);
      for (const auto& [name, n] : codes_) {
        codes += (codes.empty() ? "" : ",") + name + ":" + std::to_string(n);
      }
    }
    std::printf(
        "CHAOS-SUMMARY id=%s ops=%llu put_ok=%llu put_fail=%llu upsert_ok=%llu upsert_fail=%llu "
        "get_ok=%llu get_miss=%llu get_err=%llu batch_gets=%llu remove_ok=%llu remove_fail=%llu "
        "verified_bytes=%llu max_verified=%llu large_verified=%llu wrong=%llu "
        "checksum_mismatch=%llu codes=%s\n",
        o_.id.c_str(), U(ops_), U(put_ok_), U(put_fail_), U(upsert_ok_), U(upsert_fail_),
        U(get_ok_), U(get_miss_), U(get_err_), U(batch_gets_), U(remove_ok_), U(remove_fail_),
        U(verified_bytes_), U(max_verified_), U(large_verified_), U(wrong_count_),
        U(checksum_mismatch_), codes.empty() ? "-" : codes.c_str());
    std::fflush(stdout);
  }

 private:
  static unsigned long long U(const std::atomic<uint64_t>& a) { return a.load(); }

  bool ShouldStop() {
    if (stop_.load(std::memory_order_relaxed)) return true;
    struct stat st {};
    if (::stat((o_.dir + "/stop").c_str(), &st) == 0 ||
        std::chrono::steady_clock::now() - start_ > std::chrono::seconds(o_.seconds)) {
      stop_ = true;
    }
    return stop_;
  }

  void Count(const char* op, const Status& s) {
    std::lock_guard lock(mu_);
    codes_[std::string(op) + ":" + std::string(ErrorCodeName(s.code()))]++;
  }
  // While the master is down, or every segment is quarantined after its restart, calls fail
  // at once: do not spin.
  static void BackOff(const Status& s) {
    if (s.code() == ErrorCode::RPC_FAIL || s.code() == ErrorCode::RPC_TIMEOUT) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else if (s.code() == ErrorCode::NO_AVAILABLE_HANDLE) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  uint32_t LogUniform(std::mt19937_64& rng, uint32_t lo, uint32_t hi) {
    std::uniform_real_distribution<double> d(std::log(double(lo)), std::log(double(hi)));
    double v = std::exp(d(rng));
    return std::clamp<uint32_t>(static_cast<uint32_t>(v), lo, hi);
  }

  // Own keys of thread t: j % threads == t.
  int PickOwn(std::mt19937_64& rng, int t) {
    int per = (o_.keys - t + o_.threads - 1) / o_.threads;
    return t + o_.threads * static_cast<int>(rng() % static_cast<uint64_t>(per));
  }

  void Loop(int t) {
    std::mt19937_64 rng(o_.seed * 1000003 + static_cast<uint64_t>(t));
    while (!ShouldStop()) {
      ++ops_;
      int r = static_cast<int>(rng() % 100);
      if (r < 15) {
        PutSome(rng, t, 1, false);
      } else if (r < 30) {
        PutSome(rng, t, 1, true);
      } else if (r < 38) {
        PutSome(rng, t, 2 + static_cast<int>(rng() % 3), rng() % 2 == 0);
      } else if (r < 66) {
        GetSome(rng, t, 1);
      } else if (r < 84) {
        GetSome(rng, t, 2 + static_cast<int>(rng() % 7));
      } else {
        RemoveSome(rng, t, rng() % 4 == 0 ? 2 : 1);
      }
    }
  }

  void PutSome(std::mt19937_64& rng, int t, int n, bool upsert) {
    std::vector<int> js;
    for (int tries = 0; static_cast<int>(js.size()) < n && tries < 4 * n; ++tries) {
      int j = PickOwn(rng, t);
      if (std::find(js.begin(), js.end(), j) == js.end()) js.push_back(j);
    }
    const uint32_t max = n == 1 ? o_.max_size : std::min<uint32_t>(o_.max_size, 1 << 20);
    ReplicateConfig config;
    config.replica_num = rng() % 2 == 0 ? 1 : 2;
    std::vector<std::string> keys;
    std::vector<uint64_t> versions;
    std::vector<std::vector<std::byte>> values;
    for (int j : js) {
      keys.push_back(KeyOf(o_.id, j));
      versions.push_back(own_[j].next_version++);
      values.push_back(MakeValue(keys.back(), versions.back(), LogUniform(rng, o_.min_size, max)));
    }
    const char* op = n == 1 ? (upsert ? "upsert" : "put") : (upsert ? "batch-upsert" : "batch-put");
    for (size_t i = 0; i < keys.size(); ++i) {
      attempts_.Write("P " + std::to_string(WallMs()) + " " + keys[i] + " " +
                      std::to_string(versions[i]) + " " + std::to_string(values[i].size()) + " " +
                      std::to_string(config.replica_num) + " " + op + "\n");
    }
    std::vector<Status> results;
    if (keys.size() == 1) {
      results.push_back(upsert ? client_->Upsert(keys[0], values[0], config)
                               : client_->Put(keys[0], values[0], config));
    } else {
      std::vector<ByteSpan> spans(values.begin(), values.end());
      results = upsert ? client_->BatchUpsert(keys, spans, config)
                       : client_->BatchPut(keys, spans, config);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      const Status& s = i < results.size() ? results[i] : Status(ErrorCode::INTERNAL_ERROR, "");
      attempts_.Write("E " + std::to_string(WallMs()) + " " + keys[i] + " " +
                      std::to_string(versions[i]) + " " +
                      std::to_string(static_cast<int>(s.code())) + "\n");
      (upsert ? (s.ok() ? upsert_ok_ : upsert_fail_) : (s.ok() ? put_ok_ : put_fail_))++;
      Count(upsert ? "upsert" : "put", s);
      // An upsert answered OK is the current version: nothing older may be read any more.
      if (s.ok() && upsert) own_[js[i]].floor = versions[i];
    }
    if (!results.empty()) BackOff(results[0]);
  }

  // The reading thread owns keys "chaos/<id>/k<j>" with j % threads == t.
  Check CheckFor(const std::string& key, int t) {
    Check c;
    const std::string prefix = "chaos/" + o_.id + "/k";
    if (key.compare(0, prefix.size(), prefix) != 0) return c;
    int j = std::stoi(key.substr(prefix.size()));
    if (j % o_.threads != t) return c;
    c.own = true;
    c.floor = own_[j].floor;
    c.next_version = own_[j].next_version;
    return c;
  }

  void GetSome(std::mt19937_64& rng, int t, int n) {
    std::vector<std::string> keys;
    for (int tries = 0; static_cast<int>(keys.size()) < n && tries < 4 * n; ++tries) {
      const std::string& k = universe_[rng() % universe_.size()];
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
    std::vector<Check> checks;
    for (const auto& k : keys) checks.push_back(CheckFor(k, t));
    const int64_t started = WallMs();
    std::vector<Result<std::vector<std::byte>>> got;
    if (keys.size() == 1) {
      got.push_back(client_->Get(keys[0]));
    } else {
      got = client_->BatchGet(keys);
      ++batch_gets_;
    }
    for (size_t i = 0; i < keys.size() && i < got.size(); ++i) {
      if (!got[i].ok()) {
        const Status& s = got[i].status();
        (s.code() == ErrorCode::OBJECT_NOT_FOUND ? get_miss_ : get_err_)++;
        Count(keys.size() == 1 ? "get" : "batch-get", s);
        if (s.code() == ErrorCode::CHECKSUM_MISMATCH) {
          ++checksum_mismatch_;
          const int64_t now = WallMs();
          Diagnose(keys[i], "CHECKSUM_MISMATCH in a " + std::to_string(keys.size()) +
                                "-key get started at " + std::to_string(started) +
                                " ms, answered after " + std::to_string(now - started) +
                                " ms (lease TTL 1 s): " + s.message());
        }
        continue;
      }
      Examine(keys[i], *got[i], checks[i], started, keys.size() == 1 ? "get" : "batch-get");
    }
    if (!got.empty() && !got[0].ok()) BackOff(got[0].status());
  }

  void Examine(const std::string& key, const std::vector<std::byte>& bytes, const Check& check,
               int64_t started, const char* op) {
    Verdict v = VerifyValue(key, bytes);
    std::string problem;
    if (!v.ok) {
      problem = "WRONG BYTES: " + v.what;
    } else if (check.own && v.version >= check.next_version) {
      problem = "NEVER ATTEMPTED: version " + std::to_string(v.version) +
                " was not put yet (next version " + std::to_string(check.next_version) + ")";
    } else if (check.own && v.version < check.floor) {
      problem = "STALE: version " + std::to_string(v.version) + " read after version " +
                std::to_string(check.floor) +
                " was upserted (OK) or the key was removed (OK) after version " +
                std::to_string(check.floor - 1);
    }
    if (!problem.empty()) {
      ++wrong_count_;
      Report(key, op, started, bytes.size(), problem);
      return;
    }
    ++get_ok_;
    Count(op, Status::Ok());
    verified_bytes_ += bytes.size();
    if (bytes.size() > max_verified_.load()) max_verified_ = bytes.size();
    if (bytes.size() >= (4u << 20)) ++large_verified_;
    std::lock_guard lock(mu_);
    if (seen_.emplace(key, v.version).second) {
      reads_.Write("G " + key + " " + std::to_string(v.version) + " " +
                   std::to_string(bytes.size()) + "\n");
    }
  }

  // Where the key's replicas are now and what their bytes are now (after the fact).
  std::string DescribeReplicas(const std::string& key) {
    auto stat = client_->Stat(key);
    if (!stat.ok()) return "  stat now: " + stat.status().ToString() + "\n";
    std::string out = "  stat now: state " + stat->state + ", size " +
                      std::to_string(stat->size) + ", read locks " +
                      std::to_string(stat->read_locks) + "\n";
    for (const auto& r : stat->replicas) {
      out += "    replica on " + r.segment_name + " (" + r.endpoint + ") offset " +
             std::to_string(r.offset) + " length " + std::to_string(r.length) + ": ";
      const std::string path = "/dev/shm/granary-" + r.segment_name;
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        out += "cannot open " + path + "\n";
        continue;
      }
      std::vector<std::byte> raw(r.length);
      ssize_t n = ::pread(fd, raw.data(), raw.size(), static_cast<off_t>(r.offset));
      ::close(fd);
      if (n != static_cast<ssize_t>(raw.size())) {
        out += "short read of " + path + "\n";
        continue;
      }
      Verdict v = VerifyValue(key, raw);
      out += v.ok ? "bytes verify as version " + std::to_string(v.version) + "\n"
                  : "bytes do NOT verify: " + NameHashes(v.what) + "\n";
    }
    return out;
  }

  // "key_hash <hex>" followed by "(= <key>)" for every key this worker knows.
  std::string NameHashes(std::string text) const {
    for (const auto& k : universe_) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "key_hash %016llx", static_cast<unsigned long long>(KeyHash(k)));
      const std::string needle = hex;
      for (size_t at = text.find(needle); at != std::string::npos;
           at = text.find(needle, at + needle.size())) {
        text.insert(at + needle.size(), " (= " + k + ")");
      }
    }
    return text;
  }

  void Report(const std::string& key, const char* op, int64_t started, size_t size,
              const std::string& problem_in) {
    const std::string problem = NameHashes(problem_in);
    std::string text = "=== " + o_.id + " (" + (o_.use_shm ? "shm" : "tcp") + ") " + op + " of " +
                       key + " started at " + std::to_string(started) + " ms, answered OK at " +
                       std::to_string(WallMs()) + " ms with " + std::to_string(size) +
                       " bytes\n  " + problem + "\n";
    if (reports_.fetch_add(1) < kMaxReports) {
      text += DescribeReplicas(key);
      wrong_.Write(text);
    }
    std::fprintf(stderr, "%s", text.c_str());
  }

  void Diagnose(const std::string& key, const std::string& what) {
    if (diagnoses_.fetch_add(1) >= kMaxDiagnoses) return;
    diag_.Write("=== " + o_.id + " (" + (o_.use_shm ? "shm" : "tcp") + ") " + key + ": " + what +
                "\n" + DescribeReplicas(key));
  }

  void RemoveSome(std::mt19937_64& rng, int t, int n) {
    std::vector<int> js;
    for (int tries = 0; static_cast<int>(js.size()) < n && tries < 4 * n; ++tries) {
      int j = PickOwn(rng, t);
      if (std::find(js.begin(), js.end(), j) == js.end()) js.push_back(j);
    }
    std::vector<std::string> keys;
    for (int j : js) keys.push_back(KeyOf(o_.id, j));
    std::vector<Status> results;
    if (keys.size() == 1) {
      results.push_back(client_->Remove(keys[0]));
    } else {
      results = client_->BatchRemove(keys);
    }
    for (size_t i = 0; i < keys.size() && i < results.size(); ++i) {
      const Status& s = results[i];
      Count("remove", s);
      attempts_.Write("R " + std::to_string(WallMs()) + " " + keys[i] + " " +
                      std::to_string(static_cast<int>(s.code())) + "\n");
      const bool gone = s.ok() || s.code() == ErrorCode::OBJECT_NOT_FOUND;
      (gone ? remove_ok_ : remove_fail_)++;
      // Gone: no version attempted so far may be read again.
      if (gone) own_[js[i]].floor = own_[js[i]].next_version;
    }
    if (!results.empty()) BackOff(results[0]);
  }

  const WorkerOptions& o_;
  Client* client_;
  LineFile attempts_, reads_, wrong_, diag_;
  std::vector<OwnKey> own_;
  std::vector<std::string> universe_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<bool> stop_{false};

  std::mutex mu_;
  std::map<std::string, uint64_t> codes_;
  std::set<std::pair<std::string, uint64_t>> seen_;

  std::atomic<uint64_t> ops_{0}, put_ok_{0}, put_fail_{0}, upsert_ok_{0}, upsert_fail_{0},
      get_ok_{0}, get_miss_{0}, get_err_{0}, batch_gets_{0}, remove_ok_{0}, remove_fail_{0},
      verified_bytes_{0}, max_verified_{0}, large_verified_{0}, wrong_count_{0},
      checksum_mismatch_{0};
  std::atomic<int> reports_{0}, diagnoses_{0};
};

}  // namespace

int RunWorker(const WorkerOptions& o) {
  ClientOptions options;
  options.master_address = o.master;
  options.use_shared_memory = o.use_shm;
  options.rpc_timeout_ms = 5000;
  options.io_timeout_ms = 5000;
  // The master may be down at this moment (a replacement worker starts during the chaos).
  std::unique_ptr<Client> client;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  Status last;
  while (!client && std::chrono::steady_clock::now() < deadline) {
    auto connected = Client::Connect(options);
    if (connected.ok()) {
      client = std::move(*connected);
    } else {
      last = connected.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  if (!client) {
    std::fprintf(stderr, "chaos %s: connect: %s\n", o.id.c_str(), last.ToString().c_str());
    return kExitRpc;
  }
  Worker worker(o, client.get());
  std::printf("chaos %s: running (%s, %d threads, %d keys, seed %llu)\n", o.id.c_str(),
              o.use_shm ? "shm" : "tcp", o.threads, o.keys,
              static_cast<unsigned long long>(o.seed));
  std::fflush(stdout);
  worker.Run();
  worker.PrintSummary();
  client->Close();
  return worker.AnyWrong() ? kExitWrongBytes : kExitOk;
}

}  // namespace granary::chaos
