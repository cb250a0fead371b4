#include "security/secret.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstdio>
#include <cstring>

namespace granary::security {

namespace {
constexpr size_t kMaxSecretFileBytes = 4096;  // a secret is a line, not a document

Status Bad(const std::string& path, const std::string& why) {
  return Status(ErrorCode::INVALID_PARAMS, "secret file " + path + ": " + why);
}
}  // namespace

Result<std::string> ReadPrivateFile(const std::string& path, size_t max_bytes, const char* what) {
  const auto bad = [&](const std::string& why) {
    return Status(ErrorCode::INVALID_PARAMS, std::string(what) + " " + path + ": " + why);
  };
  if (path.empty()) return bad("no file named");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return bad(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return bad("not a regular file");
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    ::close(fd);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return bad(std::string("mode ") + mode +
               " lets group or others at it; chmod 600 it (whoever reads it holds its secrets)");
  }
  std::string bytes(max_bytes + 1, '\0');
  size_t got = 0;
  while (got < bytes.size()) {  // bounded by the buffer
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return bad(why);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got > max_bytes) return bad("over " + std::to_string(max_bytes) + " bytes");
  bytes.resize(got);
  return bytes;
}

Status CheckSecret(std::string_view secret) {
  if (secret.size() < kMinSecretBytes) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "shorter than " + std::to_string(kMinSecretBytes) +
                      " characters (make one with `openssl rand -hex 16`)");
  }
  for (char c : secret) {
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) {
      return Status(ErrorCode::INVALID_PARAMS,
                    "only printable ASCII without spaces may form a secret");
    }
  }
  return Status::Ok();
}

std::string_view TrimBlanks(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view NextLine(std::string_view* text) {
  const size_t eol = text->find('\n');
  const std::string_view line = text->substr(0, eol);
  text->remove_prefix(eol == std::string_view::npos ? text->size() : eol + 1);
  return TrimBlanks(line);
}

namespace {
// A secret file's bytes: reads it once, and its first line as the secret (*rest: the others).
Result<std::string> ReadFirstSecret(const std::string& path, std::string* bytes,
                                    std::string_view* rest) {
  if (path.empty()) return Bad("(empty path)", "no file named");
  auto read = ReadPrivateFile(path, kMaxSecretFileBytes, "secret file");
  if (!read.ok()) return read.status();
  *bytes = std::move(*read);
  *rest = *bytes;
  const std::string_view line = NextLine(rest);
  if (line.empty()) return Bad(path, "empty (its first line is the secret)");
  if (Status s = CheckSecret(line); !s.ok()) return Bad(path, s.message());
  return std::string(line);
}
}  // namespace

Result<std::string> LoadSecretFile(const std::string& path) {
  std::string bytes;
  std::string_view rest;
  return ReadFirstSecret(path, &bytes, &rest);
}

Result<std::vector<std::string>> LoadAcceptedSecrets(const std::string& path) {
  std::string bytes;
  std::string_view rest;
  auto first = ReadFirstSecret(path, &bytes, &rest);
  if (!first.ok()) return first.status();
  std::vector<std::string> accepted = {std::move(*first)};
  for (size_t number = 2; !rest.empty(); ++number) {  // each pass consumes a line
    const std::string_view line = NextLine(&rest);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = "line " + std::to_string(number) + " (a secondary secret): ";
    if (Status s = CheckSecret(line); !s.ok()) return Bad(path, where + s.message());
    if (std::find(accepted.begin(), accepted.end(), line) != accepted.end()) {
      return Bad(path, where + "the same secret twice");
    }
    if (accepted.size() == kMaxAcceptedSecrets) {
      return Bad(path, "more than " + std::to_string(kMaxAcceptedSecrets) +
                           " secrets (the first and the secondary ones)");
    }
    accepted.emplace_back(line);
  }
  return accepted;
}

Result<std::string> LoadClientSecret(const std::string& path) {
  if (!path.empty()) return LoadSecretFile(path);
  const char* env = std::getenv(kSecretFileEnv);
  if (env == nullptr || *env == '\0') return std::string();
  return LoadSecretFile(env);
}

Result<UserPassword> LoadUserPasswordFile(const std::string& path) {
  auto text = ReadPrivateFile(path, 4096, "etcd auth file");
  if (!text.ok()) return text.status();
  std::string_view rest = *text;
  const std::string_view line = TrimBlanks(NextLine(&rest));
  const size_t colon = line.find(':');
  const auto bad = [&](const char* why) {
    return Status(ErrorCode::INVALID_PARAMS, std::string("etcd auth file ") + path + ": " + why);
  };
  if (colon == std::string_view::npos) return bad("its first line is not USER:PASSWORD");
  if (colon == 0) return bad("the user is empty");
  if (colon + 1 == line.size()) return bad("the password is empty");
  return UserPassword{std::string(line.substr(0, colon)), std::string(line.substr(colon + 1))};
}

Result<UserPassword> LoadClientEtcdAuth(const std::string& path) {
  if (!path.empty()) return LoadUserPasswordFile(path);
  const char* env = std::getenv(kEtcdAuthFileEnv);
  if (env == nullptr || *env == '\0') return UserPassword{};
  return LoadUserPasswordFile(env);
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  // Every byte of the longer one is visited; the difference accumulates without a branch.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  // Keeps the compiler from ending the loop at the first difference.
  volatile unsigned char result = diff;
  return result == 0;
}

bool IsLoopbackHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  // Addresses only: a name such as "127.example.com" may resolve anywhere.
  const std::string text(host);
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;  // ::ffff:127.x.y.z
  }
  return false;
}

}  // namespace granary::security
