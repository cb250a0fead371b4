#include "etcd/endpoints.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>

#include "common/logging.h"
#include "etcd/etcd_client.h"

namespace granary::etcd {

namespace {

std::string Trim(const std::string& s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

Status Invalid(const std::string& endpoints, const std::string& why) {
  return Status(ErrorCode::INVALID_PARAMS, "etcd endpoints '" + endpoints + "': " + why);
}

// "1".."65535" only: no sign, no blanks, no leading '+' that strtol would take.
bool ParsePort(const std::string& s, uint16_t* port) {
  if (s.empty() || s.size() > 5) return false;
  uint32_t value = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value == 0 || value > 65535) return false;
  *port = static_cast<uint16_t>(value);
  return true;
}

// A host name or address as far as can be told without resolving it: letters, digits, '-',
// '.', '_' (v4 addresses and names) or an IPv6 literal that inet_pton accepts.
bool ValidHost(const std::string& host, bool bracketed) {
  if (host.empty()) return false;
  if (bracketed) {
    in6_addr addr;
    return ::inet_pton(AF_INET6, host.c_str(), &addr) == 1;
  }
  return std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
  });
}

}  // namespace

Result<std::vector<HostPort>> ParseEndpoints(const std::string& endpoints) {
  std::vector<HostPort> out;
  size_t pos = 0;
  while (pos <= endpoints.size()) {
    size_t sep = endpoints.find_first_of(";,", pos);
    if (sep == std::string::npos) sep = endpoints.size();
    std::string entry = Trim(endpoints.substr(pos, sep - pos));
    pos = sep + 1;
    if (entry.empty()) continue;  // "a:1;" and "a:1;;b:2": an empty entry names nothing

    if (StartsWith(entry, "https://")) return Invalid(endpoints, "TLS (https://) is not supported");
    for (const char* scheme : {"etcd://", "http://"}) {
      if (StartsWith(entry, scheme)) entry.erase(0, std::string(scheme).size());
    }
    if (!entry.empty() && entry.back() == '/') entry.pop_back();
    if (entry.find("://") != std::string::npos) {
      return Invalid(endpoints, "unknown scheme in '" + entry + "'");
    }

    HostPort hp;
    std::string port;
    bool bracketed = false;
    if (!entry.empty() && entry.front() == '[') {
      const size_t close = entry.find(']');
      if (close == std::string::npos || close + 1 >= entry.size() || entry[close + 1] != ':') {
        return Invalid(endpoints, "'" + entry + "' is not [IPv6]:PORT");
      }
      hp.host = entry.substr(1, close - 1);
      port = entry.substr(close + 2);
      bracketed = true;
    } else {
      const size_t colon = entry.find(':');
      if (colon == std::string::npos || entry.find(':', colon + 1) != std::string::npos) {
        return Invalid(endpoints, "'" + entry + "' is not HOST:PORT (IPv6 addresses in [])");
      }
      hp.host = entry.substr(0, colon);
      port = entry.substr(colon + 1);
    }
    if (!ValidHost(hp.host, bracketed)) return Invalid(endpoints, "bad host in '" + entry + "'");
    if (!ParsePort(port, &hp.port)) return Invalid(endpoints, "bad port in '" + entry + "'");
    out.push_back(std::move(hp));
  }
  if (out.empty()) return Invalid(endpoints, "no endpoint given");
  return out;
}

std::string JoinEndpoints(const std::vector<HostPort>& endpoints) {
  std::string out;
  for (const HostPort& hp : endpoints) {
    if (!out.empty()) out += ';';
    const bool v6 = hp.host.find(':') != std::string::npos;
    out += (v6 ? "[" + hp.host + "]" : hp.host) + ":" + std::to_string(hp.port);
  }
  return out;
}

Result<std::string> ResolveTarget(const std::vector<HostPort>& endpoints) {
  std::vector<std::string> v4, v6;
  std::string failures;
  for (const HostPort& hp : endpoints) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(hp.host.c_str(), nullptr, &hints, &found);
    if (rc != 0 || found == nullptr) {
      const std::string why = hp.host + ": " + ::gai_strerror(rc);
      GLOG_WARN("etcd endpoint {} does not resolve ({}); using the others", hp.host,
                ::gai_strerror(rc));
      failures += (failures.empty() ? "" : "; ") + why;
      continue;
    }
    for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
      char text[INET6_ADDRSTRLEN] = {};
      const std::string port = std::to_string(hp.port);
      if (ai->ai_family == AF_INET) {
        auto* sin = reinterpret_cast<sockaddr_in*>(ai->ai_addr);
        ::inet_ntop(AF_INET, &sin->sin_addr, text, sizeof(text));
        const std::string addr = std::string(text) + ":" + port;
        if (std::find(v4.begin(), v4.end(), addr) == v4.end()) v4.push_back(addr);
      } else if (ai->ai_family == AF_INET6) {
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(ai->ai_addr);
        ::inet_ntop(AF_INET6, &sin6->sin6_addr, text, sizeof(text));
        const std::string addr = "[" + std::string(text) + "]:" + port;
        if (std::find(v6.begin(), v6.end(), addr) == v6.end()) v6.push_back(addr);
      }
    }
    ::freeaddrinfo(found);
  }
  const bool use_v4 = !v4.empty();
  const std::vector<std::string>& addrs = use_v4 ? v4 : v6;
  if (addrs.empty()) {
    return Status(ErrorCode::ETCD_OPERATION_ERROR,
                  "no etcd endpoint resolves to an address (" + failures + ")");
  }
  std::string target = use_v4 ? "ipv4:" : "ipv6:";
  for (size_t i = 0; i < addrs.size(); ++i) target += (i ? "," : "") + addrs[i];
  return target;
}

std::optional<std::string> EtcdEndpointsOf(const std::string& address) {
  static const std::string kScheme = "etcd://";
  if (!StartsWith(address, kScheme)) return std::nullopt;
  return address.substr(kScheme.size());
}

}  // namespace granary::etcd
