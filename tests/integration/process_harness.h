// tests/integration/process_harness.h - run real Granary binaries as child processes in tests.
//
// Promise: every wait here is bounded (a hung child fails a test, never hangs it); a ChildProcess
// that goes out of scope is SIGKILLed and reaped, and children also die with the test process
// (PR_SET_PDEATHSIG), so a crashed test run leaves no binaries listening behind it.
// Nothing here knows about the master: the same pieces start nodes and the CLI.
// Ownership: ChildProcess owns its pid; TempDir owns its directory tree.
// Thread safety: none; use each object from the test's own thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace granary::it {

using Millis = std::chrono::milliseconds;

// Absolute path of a binary built next to granary-master (GRANARY_BIN_DIR/name).
std::string BinaryPath(const std::string& name);

// A port that was free a moment ago, for a server the test starts. Ports come from below the
// kernel's ephemeral range (net.ipv4.ip_local_port_range), at random, so no process's outgoing
// connection can take one between the pick and the server's bind, nor while a server restarts
// on it (with 127.0.0.1:0 that happened: CI's masters found their port taken). A port is handed
// out once per test process and must bind without SO_REUSEADDR. Falls back to the kernel's pick
// when the range below is too small. Aborts the test binary if no socket can be bound at all.
uint16_t PickFreePort();

// Polls `predicate` every `interval` until it returns true (-> true) or `timeout` elapsed
// (-> false; the predicate is evaluated one last time at the deadline).
bool WaitUntil(const std::function<bool()>& predicate, Millis timeout, Millis interval = Millis(20));

// A fresh directory under $TMPDIR (or /tmp), removed recursively on destruction unless the
// environment variable GRANARY_IT_KEEP_TMP is set (then its path is printed instead).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "granary-it");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  // Writes `contents` to path()/name and returns its path.
  std::string WriteFile(const std::string& name, const std::string& contents) const;

 private:
  std::string path_;
};

// How a child ended.
struct ExitStatus {
  bool exited = false;  // exited normally; `code` is valid
  int code = -1;
  int signal = 0;  // killed by this signal when !exited
  bool Succeeded() const { return exited && code == 0; }
  std::string ToString() const;
};

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // SIGKILL + reap if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts `binary` with `args` (argv[0] is the binary itself), stdout and stderr appended to
  // `log_path` (truncated first), stdin from `stdin_path`. Returns false and fills *error if the
  // process could not be started (including exec failure: the child reports errno over a pipe).
  bool Start(const std::string& binary, const std::vector<std::string>& args,
             const std::string& log_path, std::string* error,
             const std::string& stdin_path = "/dev/null");

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // True while the child has been started and not yet reaped (reaps it if it has exited).
  bool Running();
  // Sends `sig`; false if the process is not running.
  bool Kill(int sig);
  // After Kill(SIGSTOP): waits (bounded) until every thread of the child is stopped. kill()
  // returns before a thread running on another core has taken the signal.
  bool WaitStopped(Millis timeout);
  // Waits up to `timeout` for the child to exit; nullopt if it is still running. Calling it again
  // after the child was reaped returns the same status.
  std::optional<ExitStatus> Wait(Millis timeout);
  // SIGKILL and reap (bounded); a no-op if not running.
  void KillAndReap();
  // The log written so far; at most the last `max_bytes` of it.
  std::string LogContents(size_t max_bytes = 64 * 1024) const;
  // Exit status once reaped.
  const std::optional<ExitStatus>& exit_status() const { return status_; }

 private:
  bool Reap(bool block_briefly);

  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<ExitStatus> status_;
};

// Runs a command to completion (bounded by `timeout`; killed after it). The combined output goes
// to `log_path`. Returns the exit status, or nullopt (and *error) if it did not start or finish.
std::optional<ExitStatus> RunCommand(const std::string& binary, const std::vector<std::string>& args,
                                     const std::string& log_path, Millis timeout,
                                     std::string* error,
                                     const std::string& stdin_path = "/dev/null");

// Reads a whole file ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// A minimal HTTP/1.0 GET against 127.0.0.1:port. status is 0 and error set when there was no
// valid answer within `timeout` (connection refused, timeout, malformed reply).
struct HttpResult {
  int status = 0;
  std::string content_type;
  std::string body;
  std::string error;
};
HttpResult HttpGet(uint16_t port, const std::string& path, Millis timeout = Millis(5000));

}  // namespace granary::it
