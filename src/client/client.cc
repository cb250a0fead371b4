// The Client: Client::Connect builds a ClientImpl (client/client_impl.h), whose put and read
// paths are in client_put.cc and client_get.cc.
#include "client/client_impl.h"

namespace granary {

using client::ClientImpl;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.master_address.empty()) {
    return Status(ErrorCode::INVALID_PARAMS, "master address is empty");
  }
  auto secret = security::LoadClientSecret(options.auth_token_file);
  if (!secret.ok()) return secret.status();
  auto tls = security::LoadClientTls(
      {options.tls_cert_file, options.tls_key_file, options.tls_ca_file});
  if (!tls.ok()) return tls.status();
  auto etcd_user = security::LoadClientEtcdAuth(options.etcd_auth_file);
  if (!etcd_user.ok()) return etcd_user.status();
  auto locator = client::MasterLocator::Create(options.master_address, options.cluster_id,
                                               options.rpc_timeout_ms, false, *secret, *tls,
                                               {etcd_user->user, etcd_user->password});
  if (!locator.ok()) return locator.status();
  auto client = std::make_unique<ClientImpl>(options, std::move(*locator));
  if (Status s = client->Init(); !s.ok()) return s;
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace granary
