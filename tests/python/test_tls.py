"""TLS to the master from Python (docs/security.md, "TLS for the control plane"): granary.Store
and the Mooncake layer speak TLS with the files given to them, else $GRANARY_TLS_CA,
$GRANARY_TLS_CERT and $GRANARY_TLS_KEY; a master with --tls-ca refuses clients without a
certificate of its CA, and nothing of theirs is stored."""

import subprocess

import pytest

import granary
from granary.compat.mooncake import MooncakeDistributedStore

from conftest import Master, Node


def _openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, and a certificate for 127.0.0.1 and localhost that it signed."""
    d = tmp_path_factory.mktemp("pki")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl(d, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=py-test-ca")
    _openssl(d, "req", *ec, "-keyout", "peer.key", "-out", "peer.csr", "-subj", "/CN=peer")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(d, "x509", "-req", "-in", "peer.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "peer.pem", "-days", "2", "-extfile", "san.cnf")
    (d / "peer.key").chmod(0o600)
    return {"ca": str(d / "ca.pem"), "cert": str(d / "peer.pem"), "key": str(d / "peer.key")}


@pytest.fixture
def tls_store(pki, monkeypatch):
    for name in ("GRANARY_TLS_CA", "GRANARY_TLS_CERT", "GRANARY_TLS_KEY"):
        monkeypatch.delenv(name, raising=False)
    flags = ("--tls-cert", pki["cert"], "--tls-key", pki["key"], "--tls-ca", pki["ca"])
    master = Master(*flags)
    node = Node(master.address, size="64MiB",
                extra=("--tls-ca", pki["ca"], "--tls-cert", pki["cert"], "--tls-key", pki["key"]))
    yield master
    node.stop()
    master.stop()


def test_a_store_with_the_cas_certificate_works_and_others_get_nothing(tls_store, pki,
                                                                       monkeypatch):
    master = tls_store
    with granary.Store(master.address, tls_ca_file=pki["ca"], tls_cert_file=pki["cert"],
                       tls_key_file=pki["key"]) as store:
        store.put("kept", b"t" * 8192)
        assert store.get("kept") == b"t" * 8192

    # Plaintext, and TLS without a client certificate: refused before any call is read.
    for kwargs in ({}, {"tls_ca_file": pki["ca"]}):
        with granary.Store(master.address, rpc_timeout_ms=2000, **kwargs) as stranger:
            with pytest.raises(granary.Error):
                stranger.put("stranger", b"x")
            with pytest.raises(granary.Error):
                stranger.get("kept")

    # From the environment, as a deployment would set it.
    monkeypatch.setenv("GRANARY_TLS_CA", pki["ca"])
    monkeypatch.setenv("GRANARY_TLS_CERT", pki["cert"])
    monkeypatch.setenv("GRANARY_TLS_KEY", pki["key"])
    with granary.Store(master.address) as store:
        assert store.get("kept") == b"t" * 8192
        assert not store.exist("stranger"), "the strangers stored nothing"


def test_a_key_others_may_read_is_an_invalid_argument(pki, tmp_path):
    loose = tmp_path / "loose.key"
    loose.write_bytes(open(pki["key"], "rb").read())
    loose.chmod(0o644)
    with pytest.raises(granary.InvalidArgument) as err:
        granary.Store("127.0.0.1:1", tls_ca_file=pki["ca"], tls_cert_file=pki["cert"],
                      tls_key_file=str(loose))
    assert "loose.key" in str(err.value)
    assert "PRIVATE KEY" not in str(err.value)


def test_the_mooncake_layer_speaks_tls_from_its_config(tls_store, pki):
    master = tls_store
    store = MooncakeDistributedStore()
    assert store.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                        "master_server_addr": master.address, "tls_ca_file": pki["ca"],
                        "tls_cert_file": pki["cert"], "tls_key_file": pki["key"]}) == 0
    assert store.put("mc-tls", b"m" * 1024) == 0
    assert store.get("mc-tls") == b"m" * 1024
    store.close()

    plain = MooncakeDistributedStore()
    assert plain.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                        "master_server_addr": master.address}) != 0
