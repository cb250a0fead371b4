"""The cluster's secret from Python (docs/security.md): granary.Store and the Mooncake layer present
the file given to them, else $GRANARY_AUTH_TOKEN_FILE; a master started with --auth-token-file
refuses the others with granary.Unauthenticated (-1100), and nothing of theirs is applied."""

import os

import pytest

import granary
from granary.compat.mooncake import MooncakeDistributedStore

from conftest import Master, Node

SECRET = "c0ffee00c0ffee00c0ffee00c0ffee00"


def _secret_file(tmp_path, name, secret):
    path = tmp_path / name
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def secured(tmp_path, monkeypatch):
    monkeypatch.delenv("GRANARY_AUTH_TOKEN_FILE", raising=False)
    good = _secret_file(tmp_path, "secret", SECRET)
    wrong = _secret_file(tmp_path, "wrong", "deadbeefdeadbeefdeadbeefdeadbeef")
    master = Master("--auth-token-file", good)
    node = Node(master.address, size="64MiB", extra=("--auth-token-file", good))
    yield master, good, wrong
    node.stop()
    master.stop()


def test_a_store_with_the_secret_works_and_others_are_refused(secured, monkeypatch):
    master, good, wrong = secured
    with granary.Store(master.address, auth_token_file=good) as store:
        store.put("kept", b"v" * 4096)
        assert store.get("kept") == b"v" * 4096

    for file in ("", wrong):
        with granary.Store(master.address, auth_token_file=file) as intruder:
            with pytest.raises(granary.Unauthenticated) as err:
                intruder.put("intruder", b"x")
            assert err.value.code == -1100
            assert isinstance(err.value, PermissionError)
            assert SECRET not in str(err.value)
            with pytest.raises(granary.Unauthenticated):
                intruder.get("kept")
            with pytest.raises(granary.Unauthenticated):
                intruder.remove_all()

    # From the environment, as a deployment would set it.
    monkeypatch.setenv("GRANARY_AUTH_TOKEN_FILE", good)
    with granary.Store(master.address) as store:
        assert store.get("kept") == b"v" * 4096, "the intruders removed nothing"
        assert not store.exist("intruder")


def test_an_unusable_secret_file_is_an_invalid_argument(tmp_path):
    loose = tmp_path / "loose"
    loose.write_text(SECRET + "\n")
    loose.chmod(0o644)
    with pytest.raises(granary.InvalidArgument) as err:
        granary.Store("127.0.0.1:1", auth_token_file=str(loose))
    assert "chmod 600" in str(err.value)
    assert SECRET not in str(err.value)


def test_the_mooncake_layer_presents_the_secret_from_its_config(secured):
    master, good, wrong = secured
    store = MooncakeDistributedStore()
    assert store.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                        "master_server_addr": master.address, "auth_token_file": good}) == 0
    assert store.put("mc-key", b"m" * 1024) == 0
    assert store.get("mc-key") == b"m" * 1024
    store.close()

    refused = MooncakeDistributedStore()
    assert refused.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                          "master_server_addr": master.address, "auth_token_file": wrong}) == -1100


ADMIN = "ad0000000000000000000000000000ad"
ACME = "acacacacacacacacacacacacacacacac"
GLOBEX = "9b9b9b9b9b9b9b9b9b9b9b9b9b9b9b9b"


@pytest.fixture
def tenanted(tmp_path, monkeypatch):
    """A master with an admin secret and two tenants (acme with a 256 KiB quota), and a node."""
    monkeypatch.delenv("GRANARY_AUTH_TOKEN_FILE", raising=False)
    files = {name: _secret_file(tmp_path, name, secret)
             for name, secret in (("cluster", SECRET), ("admin", ADMIN), ("acme", ACME),
                                  ("globex", GLOBEX))}
    tenants = _secret_file(tmp_path, "tenants", f"acme {ACME} 256KiB\nglobex {GLOBEX}")
    master = Master("--auth-token-file", files["cluster"], "--admin-token-file", files["admin"],
                    "--tenants-file", tenants)
    node = Node(master.address, size="64MiB", extra=("--auth-token-file", files["cluster"]))
    yield master, files
    node.stop()
    master.stop()


def test_tenants_keep_their_keys_apart_within_their_quotas(tenanted):
    master, files = tenanted
    with granary.Store(master.address, auth_token_file=files["acme"]) as acme, \
            granary.Store(master.address, auth_token_file=files["globex"]) as globex, \
            granary.Store(master.address, auth_token_file=files["cluster"]) as member:
        for store, value in ((acme, b"a" * 100), (globex, b"g" * 200), (member, b"m" * 300)):
            store.put("same-key", value)
        assert acme.get("same-key") == b"a" * 100
        assert globex.get("same-key") == b"g" * 200
        assert member.get("same-key") == b"m" * 300
        acme.put("acme-only", b"x")
        assert not globex.exist("acme-only")
        assert not member.exist("acme-only")
        assert [row[0] for row in globex.query(".*")] == ["same-key"]

        # Past the quota: QuotaExceeded (a NoSpace), and globex is not affected.
        with pytest.raises(granary.QuotaExceeded) as err:
            acme.put("big", b"b" * (256 * 1024))
        assert err.value.code == -1102
        assert isinstance(err.value, granary.NoSpace)
        globex.put("big", b"b" * (256 * 1024))

        # Forced removal is the admin's.
        with pytest.raises(granary.PermissionDenied) as denied:
            acme.remove("same-key", force=True)
        assert denied.value.code == -1101
        status = acme.cluster_status()
        assert (status["caller_role"], status["caller_tenant"]) == ("tenant", "acme")
        assert [t["name"] for t in status["tenants"]] == ["acme"]
        assert status["tenants"][0]["quota_bytes"] == 256 * 1024

    with granary.Store(master.address, auth_token_file=files["admin"]) as admin:
        assert admin.cluster_status()["caller_role"] == "admin"
        assert admin.remove_all(force=True) == 5  # every namespace's objects


def test_the_mooncake_tenant_id_is_the_tenant_the_token_names(tenanted):
    master, files = tenanted
    store = MooncakeDistributedStore()
    assert store.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                        "master_server_addr": master.address, "auth_token_file": files["acme"],
                        "tenant_id": "acme"}) == 0
    assert store.put("mc", b"acme's") == 0
    store.close()
    with granary.Store(master.address, auth_token_file=files["globex"]) as globex:
        assert not globex.exist("mc")

    other = MooncakeDistributedStore()
    assert other.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                        "master_server_addr": master.address, "auth_token_file": files["globex"],
                        "tenant_id": "acme"}) == -1101
    assert other.health_check() == 1
