// security/secret.h - the cluster's shared secret (docs/security.md): read from a file, presented
// by every client, node and master, compared without telling a guesser how close it came.
//
// Promise: LoadSecretFile returns the file's first line without surrounding whitespace, or
// INVALID_PARAMS naming the file and the fault (missing, unreadable, empty, shorter than
// kMinSecretBytes, readable or writable by group or others: like an ssh key, the file must be
// mode 0600 or 0400). No message ever contains the secret. SecretsEqual's time depends on the
// lengths only, never on where two secrets differ. IsLoopbackHost says whether a bind address
// can be reached from this host alone (what a process may serve without a secret).
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "granary/status.h"

namespace granary::security {

// 16 bytes: `openssl rand -hex 16` gives 32 characters; shorter ones are guessable.
inline constexpr size_t kMinSecretBytes = 16;
// On gRPC it travels as rpc::kAuthMetadataKey (proto/rpc_util.h), with the channel.
// The environment variable clients read when no file is given (CLI, Python, Mooncake layer).
inline constexpr const char* kSecretFileEnv = "GRANARY_AUTH_TOKEN_FILE";

Result<std::string> LoadSecretFile(const std::string& path);

// The whole of a file that only its owner may read (mode 0600 or 0400) and of at most max_bytes;
// else INVALID_PARAMS "<what> <path>: <fault>". The secret files and the tenants file use it.
Result<std::string> ReadPrivateFile(const std::string& path, size_t max_bytes, const char* what);
// The secret files' and the tenants file's lines: without surrounding blanks (space, tab, CR);
// NextLine takes the next line off *text, with its newline.
std::string_view TrimBlanks(std::string_view s);
std::string_view NextLine(std::string_view* text);
// At least kMinSecretBytes of printable ASCII without spaces; else INVALID_PARAMS saying why
// (never quoting it).
Status CheckSecret(std::string_view secret);

// What a master accepts from a secret file: the first line (the secret it presents itself) and
// then each further line that is not blank or a '#' comment, a secondary secret accepted too
// while a rotation rolls (docs/security.md); at most kMaxAcceptedSecrets, each checked as the
// first. Faults as LoadSecretFile's, naming the line.
inline constexpr size_t kMaxAcceptedSecrets = 4;
Result<std::vector<std::string>> LoadAcceptedSecrets(const std::string& path);

// `path`, else $GRANARY_AUTH_TOKEN_FILE, loaded; "" when neither names a file (no secret).
Result<std::string> LoadClientSecret(const std::string& path);

// An etcd user for a cluster whose etcd has `auth enable` (docs/security.md, "etcd"): the first
// line of a file of mode 0600 or 0400, "USER:PASSWORD" (etcdctl --user's form); INVALID_PARAMS
// naming the file and the fault (no colon, an empty user or password), never the password.
struct UserPassword {
  std::string user;
  std::string password;
};
inline constexpr const char* kEtcdAuthFileEnv = "GRANARY_ETCD_AUTH_FILE";
Result<UserPassword> LoadUserPasswordFile(const std::string& path);
// `path`, else $GRANARY_ETCD_AUTH_FILE, loaded; an empty user when neither names a file.
Result<UserPassword> LoadClientEtcdAuth(const std::string& path);

bool SecretsEqual(std::string_view a, std::string_view b);

// Addresses in 127.0.0.0/8 (IPv4-mapped too), ::1, and the name localhost. Any other name is
// not (it may resolve anywhere); 0.0.0.0, :: and "" bind every interface.
bool IsLoopbackHost(std::string_view host);

}  // namespace granary::security
