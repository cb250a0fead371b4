// A throw-away public key infrastructure for the TLS tests, made with the openssl command
// (Debian's openssl package, in install-deps): a CA, a second CA nobody trusts, and certificates
// for 127.0.0.1 and localhost signed by each. Keys are mode 0600, as the loaders require.
#pragma once

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace granary::test {

struct TestPki {
  struct Pair {
    std::string cert, key;
  };
  std::string ca;         // signs server and client
  std::string rogue_ca;   // signs rogue_client
  Pair server;            // SAN IP 127.0.0.1, DNS localhost
  Pair client;            // the same names: masters use one pair as server and as client
  Pair rogue_client;      // signed by rogue_ca
  bool ok = false;
  std::string error;

  explicit TestPki(const std::string& dir) {
    auto run = [&](const std::string& cmd) {
      if (!error.empty()) return;
      const std::string full = "cd '" + dir + "' && " + cmd + " >>pki.log 2>&1";
      if (std::system(full.c_str()) != 0) error = "failed: " + cmd + " (see " + dir + "/pki.log)";
    };
    {
      std::ofstream ext(dir + "/san.cnf");
      ext << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    }
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    for (const char* name : {"ca", "rogue-ca"}) {
      run(std::string("openssl req -x509 ") + key + " -keyout " + name + ".key -out " + name +
          ".pem -days 2 -subj /CN=granary-test-" + name);
    }
    auto issue = [&](const std::string& name, const std::string& by) {
      run("openssl req " + key + " -keyout " + name + ".key -out " + name +
          ".csr -subj /CN=granary-test-" + name);
      run("openssl x509 -req -in " + name + ".csr -CA " + by + ".pem -CAkey " + by +
          ".key -CAcreateserial -out " + name + ".pem -days 2 -extfile san.cnf");
      ::chmod((dir + "/" + name + ".key").c_str(), 0600);
      return Pair{dir + "/" + name + ".pem", dir + "/" + name + ".key"};
    };
    server = issue("server", "ca");
    client = issue("client", "ca");
    rogue_client = issue("rogue-client", "rogue-ca");
    ca = dir + "/ca.pem";
    rogue_ca = dir + "/rogue-ca.pem";
    ok = error.empty();
  }
};

}  // namespace granary::test
