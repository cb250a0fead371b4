// granary-master: parses the configuration and runs a MasterServer until SIGINT or SIGTERM.
#include <csignal>
#include <cstdio>
#include <thread>

#include "common/config_schema.h"
#include "common/logging.h"
#include "common/signals.h"
#include "master/master_config.h"
#include "master/master_server.h"

int main(int argc, char** argv) {
  using namespace granary;
  sigset_t stop_signals = BlockStopSignals();

  master::MasterConfig config;
  ConfigSchema schema("granary-master: metadata and allocation service of a Granary store");
  master::RegisterMasterConfig(schema, &config);
  if (Status s = schema.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "granary-master: %s\n", s.message().c_str());
    return 2;
  }
  if (schema.help_requested()) return 0;
  if (Status s = master::ValidateMasterConfig(config); !s.ok()) {
    std::fprintf(stderr, "granary-master: %s\n", s.message().c_str());
    return 2;
  }
  if (Status s = InitLogging("master", config.log_level); !s.ok()) {
    std::fprintf(stderr, "granary-master: %s\n", s.message().c_str());
    return 2;
  }
  GLOG_INFO("configuration:\n{}", schema.Describe());

  master::MasterServer server(config);
  if (Status s = server.Start(); !s.ok()) {
    GLOG_ERROR("{}", s.ToString());
    return 1;
  }
  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    GLOG_INFO("signal {}: shutting down", sig);
    server.Shutdown();
  });
  signal_waiter.detach();
  server.Wait();
  server.Shutdown();
  GLOG_INFO("stopped");
  return 0;
}
