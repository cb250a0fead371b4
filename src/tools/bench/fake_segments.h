// tools/bench/fake_segments.h - segments that exist only in the master's metadata.
//
// Promise: Mount registers each segment (endpoint 127.0.0.1:1: nothing is served, the metadata
// benches move no bytes) and pings every owning node each second from a background thread, so the
// master keeps them alive; destruction stops the pings and unmounts them, dropping their objects.
// Ownership: owns its connection and thread. Thread safety: one owner thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "granary/proto/master.grpc.pb.h"
#include "granary/status.h"

namespace granary::bench {

class FakeSegments {
 public:
  struct Spec {
    std::string node;
    std::string segment;
    uint64_t size = 0;
  };
  static Result<std::unique_ptr<FakeSegments>> Mount(const std::string& master,
                                                     std::vector<Spec> specs);
  ~FakeSegments();
  FakeSegments(const FakeSegments&) = delete;
  FakeSegments& operator=(const FakeSegments&) = delete;

 private:
  FakeSegments(const std::string& master, std::vector<Spec> specs);
  void Unmount();

  std::string master_;
  std::vector<Spec> specs_;  // the mounted ones
  std::unique_ptr<proto::Master::Stub> admin_;
  std::atomic<bool> done_{false};
  std::thread pinger_;
};

}  // namespace granary::bench
