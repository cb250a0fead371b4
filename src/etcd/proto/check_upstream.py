#!/usr/bin/env python3
r"""Checks the hand-kept etcd protos here against etcd's own files.

Usage: check_upstream.py GOCODE_SRC
  GOCODE_SRC: a directory holding go.etcd.io/etcd/..., github.com/gogo/protobuf/... and
  github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/... - /usr/share/gocode/src once
  golang-etcd-server-dev is installed, or the same path in its .deb files unpacked, without
  installing their 143 dependencies:
    cd $(mktemp -d) && apt-get download golang-etcd-server-dev golang-github-gogo-protobuf-dev \
        golang-github-grpc-ecosystem-grpc-gateway-dev && for d in *.deb; do dpkg-deb -x $d x; done
    check_upstream.py x/usr/share/gocode/src

Every message, enum and method kept here must exist in etcd's files with the same field names,
numbers, types, labels and oneofs, and every kept message must be kept whole. Exit 0 when all
agree; otherwise prints each difference and exits 1. Needs only protoc and Python's stdlib.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OURS = ["etcd_v3.proto", "mvcc_kv.proto"]
UPSTREAM = ["etcd/etcdserver/etcdserverpb/rpc.proto", "etcd/mvcc/mvccpb/kv.proto"]


def descriptor_text(includes, files):
    """The FileDescriptorSet of `files` in protobuf text format, via protoc alone."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        args = ["protoc", "--include_imports", "--descriptor_set_out=" + out]
        args += ["-I" + i for i in includes] + files
        subprocess.run(args, check=True)
        with open(out, "rb") as f:
            raw = f.read()
    return subprocess.run(
        ["protoc", "-I/usr/include", "--decode=google.protobuf.FileDescriptorSet",
         "google/protobuf/descriptor.proto"],
        input=raw, check=True, capture_output=True).stdout.decode()


def parse(text):
    """Text format -> nested lists of (name, value-or-list) pairs; just enough for descriptors."""
    stack = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.endswith("{"):
            node = []
            stack[-1].append((line[:-1].strip(), node))
            stack.append(node)
        elif line == "}":
            stack.pop()
        else:
            key, _, value = line.partition(":")
            stack[-1].append((key.strip(), value.strip().strip('"')))
    return stack[0]


def get(node, key, default=None):
    for k, v in node:
        if k == key:
            return v
    return default


def all_of(node, key):
    return [v for k, v in node if k == key]


def collect(fileset):
    """Full name -> description of every message, enum and method in the set."""
    items = {}

    def enum(prefix, e):
        name = prefix + "." + get(e, "name")
        items["enum " + name] = sorted((get(v, "name"), get(v, "number")) for v in all_of(e, "value"))

    def message(prefix, m):
        name = prefix + "." + get(m, "name")
        oneofs = [get(o, "name") for o in all_of(m, "oneof_decl")]
        fields = []
        for f in all_of(m, "field"):
            idx = get(f, "oneof_index")
            fields.append((get(f, "number"), get(f, "name"), get(f, "label"), get(f, "type"),
                           get(f, "type_name", ""), oneofs[int(idx)] if idx is not None else ""))
        items["message " + name] = sorted(fields)
        for nested in all_of(m, "nested_type"):
            message(name, nested)
        for e in all_of(m, "enum_type"):
            enum(name, e)

    for f in all_of(fileset, "file"):
        package = "." + get(f, "package", "")
        for m in all_of(f, "message_type"):
            message(package, m)
        for e in all_of(f, "enum_type"):
            enum(package, e)
        for s in all_of(f, "service"):
            for m in all_of(s, "method"):
                key = "method %s.%s/%s" % (package, get(s, "name"), get(m, "name"))
                items[key] = (get(m, "input_type"), get(m, "output_type"),
                              get(m, "client_streaming", "false"),
                              get(m, "server_streaming", "false"))
    return items


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    src = sys.argv[1]
    upstream_includes = [
        os.path.join(src, "go.etcd.io"),
        os.path.join(src, "github.com/gogo/protobuf"),
        os.path.join(src, "github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis"),
        "/usr/include",
    ]
    ours = collect(parse(descriptor_text([HERE], OURS)))
    theirs = collect(parse(descriptor_text(upstream_includes, UPSTREAM)))
    bad = 0
    for key, value in sorted(ours.items()):
        if key not in theirs:
            print("not in etcd's files:", key)
            bad += 1
        elif theirs[key] != value:
            print("differs:", key, "\n  ours:  ", value, "\n  etcd's:", theirs[key])
            bad += 1
    print("%d of %d kept items agree with etcd's files" % (len(ours) - bad, len(ours)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
