#!/usr/bin/env python3
"""Checks deploy/: what an operator installs must work with the binaries it ships with.

    tests/deploy/check_deploy.py --bin-dir build/bin [--repo .] [--allow-pending]

1. Prometheus: `promtool check config` of deploy/prometheus*.yml, `check rules` and `test rules`
   of the alert rules.
2. Grafana: deploy/grafana/granary.json is what make_dashboard.py writes, every panel queries the
   `datasource` variable, the rows are there, and every PromQL expression parses (promtool).
3. Kubernetes: every YAML in deploy/kubernetes/ parses and has a known kind; the Granary
   containers use only flags that `granary-master --help` / `granary-node --help` print, define
   the variables their args use, probe /health, mount the secret read-only with mode 0400; the
   node keeps /dev/shm in a memory emptyDir with a sizeLimit.
4. systemd: the units' settings that matter, flags of the example environment files, and
   `systemd-analyze verify` where it exists (skipped with a message otherwise).
5. Metric names: every name the dashboard and the rules query is exported by a real etcd-backed
   master (with tenants) and a real node this script starts on 127.0.0.1 (free ports), read from
   their /metrics. A missing name fails, unless it is in PENDING below and --allow-pending is
   given (then it is reported as pending).

Prints one line per check; exits 1 if any check failed. Every wait is bounded; every process
started is killed at the end.
"""
import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

try:
    import yaml
except ImportError:  # scripts/install-deps.sh installs python3-yaml
    print("FATAL: python3-yaml is not installed (scripts/install-deps.sh installs it)")
    sys.exit(1)

# Names the dashboard and the rules may use before the binaries export them (work on another
# branch): reported as pending with --allow-pending; CI runs without it, so a missing one fails.
# Empty: every name the dashboard and the rules query is exported today.
PENDING = set()

# Series Prometheus makes itself, not scraped from a target.
SYNTHETIC = {"up"}

DASHBOARD_ROWS = ["Cluster", "Cache", "Throughput (master)", "Nodes", "Re-replication",
                  "High availability", "Tenants"]
K8S_KINDS = {"Namespace", "Secret", "ConfigMap", "Service", "StatefulSet", "Deployment",
             "DaemonSet", "PodDisruptionBudget"}
WORKLOADS = {"StatefulSet", "Deployment", "DaemonSet"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

CHECKS = 0
FAILURES = 0


def ok(what):
    global CHECKS
    CHECKS += 1
    print(f"ok   - {what}", flush=True)


def fail(what):
    global CHECKS, FAILURES
    CHECKS += 1
    FAILURES += 1
    print(f"FAIL - {what}", flush=True)


def check(cond, what):
    (ok if cond else fail)(what)
    return cond


def note(what):
    print(f"#      {what}", flush=True)


def run(cmd, timeout=60, **kw):
    """Runs cmd; returns (exit code, stdout + stderr). Never raises for a failed command."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, **kw)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        return 124, f"timed out after {timeout}s: {e.output or ''}"
    except OSError as e:
        return 127, str(e)


# ---------------------------------------------------------------------------------------------
# PromQL: the metric names an expression reads.

PROMQL_WORDS = {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring",
                "group_left", "group_right", "inf", "nan", "atan2"}


def promql_names(expr):
    """Metric names of a PromQL expression (Grafana's $variables allowed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"'(?:[^'\\]|\\.)*'", "''", e)
    e = re.sub(r"\{[^{}]*\}", " ", e)                     # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)                     # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)                    # Grafana variables
    e = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?[smhdwy]?\b", " ", e)  # numbers, durations
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        if re.match(r"\s*\(", e[m.end():]):               # a function or an aggregation
            continue
        if word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def grafana_exprs(dashboard):
    """(where, expr) of every PromQL expression of a dashboard: panel targets, nested rows'
    panels, and query variables (label_values(METRIC, label) contributes METRIC)."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f"panel '{p.get('title')}'", t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.match(r"\s*label_values\((.*),\s*\w+\s*\)\s*$", q)
        if m:
            out.append((f"variable '{v.get('name')}'", m.group(1)))
        elif q:
            out.append((f"variable '{v.get('name')}'", q))
    return out


def grafana_to_promql(expr):
    """A dashboard expression with Grafana's variables replaced, so that promtool can parse it."""
    e = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    e = e.replace("$__range", "1h")
    return re.sub(r"\$\{?\w+\}?", ".*", e)


# ---------------------------------------------------------------------------------------------
# Flags of the binaries.

def help_flags(binary):
    code, out = run([binary, "--help"], timeout=20)
    if code != 0:
        fail(f"{os.path.basename(binary)} --help exits {code}: {out[:200]}")
        return set()
    flags = set(re.findall(r"(?:^|[\s,])(--[a-z][a-z0-9-]*)", out, re.M))
    check(len(flags) > 5, f"{os.path.basename(binary)} --help lists {len(flags)} flags")
    return flags


def flags_of(tokens):
    """The --flags among command-line tokens (--flag=value or --flag value)."""
    return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]


# ---------------------------------------------------------------------------------------------
# 1. Prometheus

def check_prometheus(repo, promtool):
    deploy = os.path.join(repo, "deploy")
    for cfg in ("prometheus.yml", "prometheus-kubernetes.yml"):
        code, out = run([promtool, "check", "config", os.path.join(deploy, cfg)])
        check(code == 0, f"promtool check config deploy/{cfg}" + ("" if code == 0 else f"\n{out}"))
    rules = os.path.join(deploy, "prometheus-rules.yml")
    code, out = run([promtool, "check", "rules", rules])
    check(code == 0, "promtool check rules deploy/prometheus-rules.yml" +
          ("" if code == 0 else f"\n{out}"))
    tests = os.path.join(deploy, "prometheus-rules.test.yml")
    if os.path.exists(tests):
        code, out = run([promtool, "test", "rules", tests], cwd=deploy, timeout=120)
        check(code == 0, "promtool test rules deploy/prometheus-rules.test.yml" +
              ("" if code == 0 else f"\n{out}"))

    names, recorded = {}, set()
    with open(rules, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    alerts = []
    for group in doc.get("groups", []):
        for r in group.get("rules", []):
            if "record" in r:
                recorded.add(r["record"])
            if "alert" in r:
                alerts.append(r["alert"])
            for n in promql_names(r["expr"]):
                names.setdefault(n, f"rule {r.get('alert') or r.get('record')}")
    for wanted in ("GranaryMasterDown", "GranaryNoLeader", "GranaryNodeDown",
                   "GranaryHitRateCollapse", "GranarySegmentNearlyFull",
                   "GranaryRereplicationBacklogGrowing"):
        check(wanted in alerts, f"alert rule {wanted} exists")
    return {n: w for n, w in names.items() if n not in recorded}


# ---------------------------------------------------------------------------------------------
# 2. Grafana

def check_dashboard(repo, promtool, work):
    gen = os.path.join(repo, "deploy", "grafana", "make_dashboard.py")
    path = os.path.join(repo, "deploy", "grafana", "granary.json")
    code, out = run([sys.executable, gen, "--check", "--out", path])
    check(code == 0, "deploy/grafana/granary.json is what make_dashboard.py writes" +
          ("" if code == 0 else f": {out.strip()}"))
    try:
        with open(path, encoding="utf-8") as f:
            board = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"deploy/grafana/granary.json parses: {e}")
        return {}
    ok("deploy/grafana/granary.json parses")
    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    check(variables.get("datasource", {}).get("type") == "datasource" and
          variables["datasource"].get("query") == "prometheus",
          "the dashboard's data source is a template variable of Prometheus data sources")
    rows = [p.get("title") for p in board.get("panels", []) if p.get("type") == "row"]
    missing_rows = [r for r in DASHBOARD_ROWS if r not in rows]
    check(not missing_rows, f"dashboard rows {DASHBOARD_ROWS}" +
          (f": missing {missing_rows}" if missing_rows else ""))
    wrong_ds = []
    for p in board.get("panels", []):
        if p.get("type") == "row":
            continue
        uids = [p.get("datasource", {}).get("uid")] + \
               [t.get("datasource", {}).get("uid") for t in p.get("targets", [])]
        if any(u != "${datasource}" for u in uids) or not p.get("targets"):
            wrong_ds.append(p.get("title"))
    check(not wrong_ds, "every panel has queries, all on ${datasource}" +
          (f": not {wrong_ds}" if wrong_ds else ""))

    exprs = grafana_exprs(board)
    check(len(exprs) > 40, f"the dashboard holds {len(exprs)} PromQL expressions")
    # promtool parses each expression as a recording rule: a syntax error fails here, not in
    # front of an operator.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": grafana_to_promql(e)}
        for i, (_, e) in enumerate(exprs)]}]}
    tmp = os.path.join(work, "dashboard-rules.yml")
    with open(tmp, "w", encoding="utf-8") as f:
        yaml.safe_dump(rules, f)
    code, out = run([promtool, "check", "rules", tmp])
    check(code == 0, "every dashboard expression is valid PromQL (promtool)" +
          ("" if code == 0 else f"\n{out}"))
    names = {}
    for where, e in exprs:
        for n in promql_names(e):
            names.setdefault(n, where)
    return names


# ---------------------------------------------------------------------------------------------
# 3. Kubernetes

def pod_spec(doc):
    spec = doc.get("spec", {})
    return spec.get("template", {}).get("spec", {})


def check_kubernetes(repo, flags):
    kdir = os.path.join(repo, "deploy", "kubernetes")
    files = sorted(f for f in os.listdir(kdir) if f.endswith((".yaml", ".yml")))
    check(files, f"deploy/kubernetes/ holds {len(files)} YAML files")
    kinds_seen = {}
    for fname in files:
        try:
            with open(os.path.join(kdir, fname), encoding="utf-8") as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            fail(f"{fname} parses: {e}")
            continue
        ok(f"{fname} parses ({', '.join(d.get('kind', '?') for d in docs)})")
        for d in docs:
            kind, name = d.get("kind"), d.get("metadata", {}).get("name")
            where = f"{fname}: {kind}/{name}"
            if not check(kind in K8S_KINDS and d.get("apiVersion") and name,
                         f"{where} has a known kind, an apiVersion and a name"):
                continue
            kinds_seen.setdefault(kind, []).append(d)
            if kind in WORKLOADS:
                check_workload(where, d, flags)
    for kind in ("Namespace", "Secret", "StatefulSet", "DaemonSet", "Service"):
        check(kind in kinds_seen, f"the Kubernetes example has a {kind}")
    # The masters run as a group of 2-3 (HA); the nodes as a DaemonSet or StatefulSet.
    masters = [d for d in kinds_seen.get("StatefulSet", []) + kinds_seen.get("Deployment", [])
               if binary_of_workload(d) == "granary-master"]
    check(masters and 2 <= masters[0].get("spec", {}).get("replicas", 1) <= 3,
          "the masters run as 2-3 replicas")
    nodes = [d for k in WORKLOADS for d in kinds_seen.get(k, [])
             if binary_of_workload(d) == "granary-node"]
    check(nodes, "the nodes run as a workload of granary-node")


def binary_of(container):
    cmd = container.get("command") or container.get("args") or [""]
    return os.path.basename(str(cmd[0]))


def binary_of_workload(doc):
    for c in pod_spec(doc).get("containers", []):
        b = binary_of(c)
        if b.startswith("granary"):
            return b
    return None


def check_workload(where, doc, flags):
    spec = pod_spec(doc)
    volumes = {v.get("name"): v for v in spec.get("volumes", [])}
    containers = spec.get("containers", [])
    check(containers, f"{where} has containers")
    for c in containers:
        binary = binary_of(c)
        cw = f"{where} container {c.get('name')}"
        check(c.get("image"), f"{cw} names an image")
        res = c.get("resources", {})
        check(res.get("requests") and res.get("limits"), f"{cw} sets resource requests and limits")
        if binary not in flags:
            continue  # etcd or another helper
        tokens = [str(t) for t in (c.get("command") or [])[1:]] + \
                 [str(t) for t in c.get("args") or []]
        used = flags_of(tokens)
        unknown = sorted(set(used) - flags[binary])
        check(not unknown, f"{cw}: every flag ({len(used)}) is in `{binary} --help`" +
              (f"; unknown: {unknown}" if unknown else ""))
        env = {e.get("name") for e in c.get("env", [])}
        refs = set(re.findall(r"\$\((\w+)\)", " ".join(tokens)))
        check(refs <= env, f"{cw}: the variables its args use are defined ({sorted(refs)})")
        for probe in ("livenessProbe", "readinessProbe"):
            path = c.get(probe, {}).get("httpGet", {}).get("path")
            check(path == "/health", f"{cw}: {probe} on /health")
        ports = {p.get("name") for p in c.get("ports", [])}
        check("http" in ports, f"{cw}: a container port named http (scraped by Prometheus)")
        secret_mounts = [m for m in c.get("volumeMounts", [])
                         if "secret" in volumes.get(m.get("name"), {})]
        check(secret_mounts, f"{cw}: mounts a Kubernetes Secret")
        for m in secret_mounts:
            mode = volumes[m["name"]]["secret"].get("defaultMode")
            check(m.get("readOnly") is True and mode == 0o400,
                  f"{cw}: Secret volume {m['name']} read-only, mode 0400 "
                  f"(got readOnly={m.get('readOnly')}, mode={oct(mode) if mode else None})")
        check("--auth-token-file" in used, f"{cw}: presents the secret (--auth-token-file)")
        check(spec.get("securityContext", {}).get("fsGroup") is None,
              f"{where}: no fsGroup (it would make the secret group-readable, which is refused)")
        if binary == "granary-node":
            shm = [m for m in c.get("volumeMounts", []) if m.get("mountPath") == "/dev/shm"]
            ed = volumes.get(shm[0]["name"], {}).get("emptyDir", {}) if shm else {}
            check(ed.get("medium") == "Memory" and ed.get("sizeLimit"),
                  f"{cw}: /dev/shm is an emptyDir of medium Memory with a sizeLimit")
        if binary == "granary-master":
            check("--etcd" in used and "--advertise" in used,
                  f"{cw}: HA flags --etcd and --advertise")
            adv = [t for t in tokens if t.startswith("--advertise")]
            check(any("$(POD_IP)" in t for t in adv) or "$(POD_IP)" in tokens,
                  f"{cw}: --advertise from the pod IP")


# ---------------------------------------------------------------------------------------------
# 4. systemd

def read_env_file(path):
    env = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, v = line.split("=", 1)
            env[k.strip()] = " ".join(shlex.split(v))
    return env


def check_systemd(repo, bin_dir, flags, work):
    sdir = os.path.join(repo, "deploy", "systemd")
    units = {}
    for b in ("granary-master", "granary-node"):
        path = os.path.join(sdir, f"{b}.service")
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            fail(f"deploy/systemd/{b}.service: {e}")
            continue
        units[b] = text
        settings = {}
        for line in text.splitlines():
            m = re.match(r"^(\w+)=(.*)$", line)
            if m:
                settings.setdefault(m.group(1), []).append(m.group(2))
        u = f"deploy/systemd/{b}.service"
        check("on-failure" in settings.get("Restart", []), f"{u}: Restart=on-failure")
        check(settings.get("LimitNOFILE") and settings.get("LimitMEMLOCK"),
              f"{u}: LimitNOFILE and LimitMEMLOCK")
        after = " ".join(settings.get("After", []))
        check("network-online.target" in after and
              "network-online.target" in " ".join(settings.get("Wants", [])),
              f"{u}: ordered after (and wants) network-online.target")
        check(settings.get("EnvironmentFile"), f"{u}: flags from an EnvironmentFile")
        exec_start = (settings.get("ExecStart") or [""])[0]
        check(os.path.basename(exec_start.split()[0]) == b if exec_start else False,
              f"{u}: ExecStart runs {b}")
        envf = os.path.join(sdir, f"{b}.env")
        if check(os.path.exists(envf), f"deploy/systemd/{b}.env: an example EnvironmentFile"):
            env = read_env_file(envf)
            var = re.findall(r"\$\{?(\w+)\}?", exec_start)
            check(var and all(v in env for v in var),
                  f"deploy/systemd/{b}.env defines {var} that ExecStart uses")
            used = flags_of(shlex.split(" ".join(env.get(v, "") for v in var)))
            unknown = sorted(set(used) - flags.get(b, set()))
            check(used and not unknown, f"deploy/systemd/{b}.env: every flag ({len(used)}) is "
                  f"in `{b} --help`" + (f"; unknown: {unknown}" if unknown else ""))
    if shutil.which("systemd-analyze") is None:
        note("SKIP systemd-analyze verify: systemd-analyze is not installed here")
        return
    # verify wants ExecStart's binary to exist: point it at the build's.
    vdir = os.path.join(work, "systemd")
    os.makedirs(vdir, exist_ok=True)
    paths = []
    for b, text in units.items():
        p = os.path.join(vdir, f"{b}.service")
        with open(p, "w", encoding="utf-8") as f:
            f.write(re.sub(r"(?m)^ExecStart=\S+", f"ExecStart={os.path.join(bin_dir, b)}", text))
        paths.append(p)
    code, out = run(["systemd-analyze", "verify"] + paths, timeout=60)
    ours = [l for l in out.splitlines() if any(os.path.basename(p) in l for p in paths)]
    if code != 0 and not ours and re.search(r"(?i)systemd|bus|boot", out):
        note(f"SKIP systemd-analyze verify: it cannot run here (exit {code}): "
             f"{out.strip().splitlines()[0] if out.strip() else ''}")
        return
    check(code == 0 and not ours, "systemd-analyze verify of both units" +
          ("" if code == 0 and not ours else f"\n{out}"))


# ---------------------------------------------------------------------------------------------
# 5. Live /metrics of a real master and node

def free_port(taken):
    """A free 127.0.0.1 port below the ephemeral range (no outgoing connection takes it first)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for attempt in range(1000):
        port = random.randrange(10000, low) if low - 10000 >= 2000 and attempt < 900 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port
    raise RuntimeError("no free port")


def http_get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return None, str(e)


def wait_for(what, pred, timeout, procs=()):
    """Polls pred() every 0.2 s for at most timeout s; stops early if a process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        for name, p in procs:
            if p.poll() is not None:
                note(f"{name} exited with {p.returncode} while waiting for {what}")
                return False
        time.sleep(0.2)
    note(f"gave up waiting for {what} after {timeout}s")
    return False


def metric_names(text):
    """(sample names, families: name -> type) of a Prometheus text exposition."""
    samples, families = set(), {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                families[parts[2]] = parts[3]
        elif line.startswith("# HELP "):
            parts = line.split()
            if len(parts) >= 3:
                families.setdefault(parts[2], "untyped")
        elif line and not line.startswith("#"):
            m = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
            if m:
                samples.add(m.group(0))
    return samples, families


def exported(name, samples, families):
    if name in samples or name in families:
        return True
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and families.get(name[: -len(suffix)]) == "histogram":
            return True
    return False


def family_of(name):
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in PENDING:
            return name[: -len(suffix)]
    return name


class Cluster:
    """An etcd, an HA master (with tenants) and a node, on free 127.0.0.1 ports."""

    def __init__(self, bin_dir, work):
        self.bin_dir, self.work = bin_dir, work
        self.procs = []
        self.shm_name = f"deploy-check-{os.getpid()}-{random.randrange(1 << 30):x}"

    def spawn(self, name, cmd):
        log = open(os.path.join(self.work, f"{name}.log"), "w", encoding="utf-8")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             cwd=self.work, start_new_session=True)
        log.close()
        self.procs.append((name, p))
        return p

    def log_tail(self, name, lines=15):
        try:
            with open(os.path.join(self.work, f"{name}.log"), encoding="utf-8",
                      errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def start(self):
        taken = set()
        etcd = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
        if not check(etcd, "etcd is installed (the HA metrics need an etcd-backed master)"):
            return False
        ec, ep = free_port(taken), free_port(taken)
        self.spawn("etcd", [etcd, "--name", "check", "--data-dir", os.path.join(self.work, "etcd"),
                            "--listen-client-urls", f"http://127.0.0.1:{ec}",
                            "--advertise-client-urls", f"http://127.0.0.1:{ec}",
                            "--listen-peer-urls", f"http://127.0.0.1:{ep}",
                            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ep}",
                            "--initial-cluster", f"check=http://127.0.0.1:{ep}",
                            "--log-level", "warn"])
        if not check(wait_for("etcd", lambda: http_get(f"http://127.0.0.1:{ec}/health")[0] == 200,
                              30, self.procs), "etcd answers /health"):
            print(self.log_tail("etcd"))
            return False

        secret = os.path.join(self.work, "secret")
        tenants = os.path.join(self.work, "tenants")
        for path, text in ((secret, "deploy-check-" + "%032x\n" % random.getrandbits(128)),
                           (tenants, "team-a tenant-a-%032x 1GiB\n" % random.getrandbits(128))):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        mp, self.master_http, mf = free_port(taken), free_port(taken), free_port(taken)
        self.spawn("master", [os.path.join(self.bin_dir, "granary-master"), "--host", "127.0.0.1",
                              "--port", str(mp), "--http-port", str(self.master_http),
                              "--fast-port", str(mf), "--etcd", f"127.0.0.1:{ec}",
                              "--cluster-id", f"deploy-check-{os.getpid()}",
                              "--sync-standbys", "0", "--auth-token-file", secret,
                              "--tenants-file", tenants, "--log-level", "warn"])

        def leads():
            code, text = http_get(f"http://127.0.0.1:{self.master_http}/metrics")
            return code == 200 and re.search(r"(?m)^granary_master_ha_leader 1\b", text)

        if not check(wait_for("the master to lead", leads, 30, self.procs),
                     "the master leads (granary_master_ha_leader 1)"):
            print(self.log_tail("master"))
            return False

        self.node_http = free_port(taken)
        disk = os.path.join(self.work, "disk")
        os.makedirs(disk)
        self.spawn("node", [os.path.join(self.bin_dir, "granary-node"), "--master",
                            f"127.0.0.1:{mp}", "--host", "127.0.0.1", "--http-port",
                            str(self.node_http), "--name", self.shm_name, "--segment-size",
                            "32MiB", "--disk-dir", disk, "--disk-size", "64MiB",
                            "--disk-shm-staging", "0", "--auth-token-file", secret,
                            "--log-level", "warn"])

        def mounted():
            code, text = http_get(f"http://127.0.0.1:{self.master_http}/metrics")
            return code == 200 and re.search(r"(?m)^granary_master_segments [1-9]", text)

        if not check(wait_for("the node's segment", mounted, 30, self.procs),
                     "the node mounted its segment"):
            print(self.log_tail("node"))
            return False
        return True

    def stop(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + 10
        for name, p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait(timeout=10)
        for path in (f"/dev/shm/granary-{self.shm_name}",):
            try:
                os.unlink(path)
            except OSError:
                pass


def check_live_names(bin_dir, work, used, allow_pending):
    cluster = Cluster(bin_dir, work)
    master_text, node_text = "", ""
    try:
        if not cluster.start():
            fail("a live master and node to read metric names from")
            return
        code, master_text = http_get(f"http://127.0.0.1:{cluster.master_http}/metrics", 5)
        if not check(code == 200, f"the master's /metrics answers ({code})"):
            master_text = ""
        got = wait_for("the node's /metrics",
                       lambda: http_get(f"http://127.0.0.1:{cluster.node_http}/metrics")[0] == 200,
                       10, cluster.procs)
        if got:
            node_text = http_get(f"http://127.0.0.1:{cluster.node_http}/metrics", 5)[1]
            ok(f"the node's /metrics answers on --http-port {cluster.node_http}")
            code, _ = http_get(f"http://127.0.0.1:{cluster.node_http}/health")
            check(code == 200, "the node's /health answers (the Kubernetes probes use it)")
        elif allow_pending:
            note("PENDING the node serves no /metrics on --http-port yet (ops-metrics work)")
        else:
            fail(f"the node's /metrics answers on --http-port {cluster.node_http}")
    finally:
        cluster.stop()
    ms, mf = metric_names(master_text)
    ns, nf = metric_names(node_text)
    samples, families = ms | ns, {**mf, **nf}
    note(f"scraped {len(mf)} master and {len(nf)} node metric families")

    pending_now, missing = [], []
    for name in sorted(used):
        where = used[name]
        if name in SYNTHETIC:
            continue
        if not name.startswith("granary_"):
            fail(f"{name} ({where}): not a Granary metric nor one Prometheus makes (a typo?)")
            continue
        if exported(name, samples, families):
            ok(f"{name} is exported ({where})")
        elif family_of(name) in PENDING and allow_pending:
            pending_now.append(name)
            note(f"PENDING {name} ({where}): not exported yet")
        else:
            missing.append(name)
            fail(f"{name} ({where}) is not exported by the master nor the node"
                 + (" (listed in PENDING: being added)" if family_of(name) in PENDING else ""))
    landed = sorted(n for n in PENDING if exported(n, samples, families))
    if landed:
        note(f"exported now, remove from PENDING: {landed}")
    unused = sorted(n for n in PENDING if not any(family_of(u) == n for u in used))
    check(not unused, "every PENDING name is used by the dashboard or the rules" +
          (f"; unused: {unused}" if unused else ""))
    if pending_now:
        note(f"{len(pending_now)} names pending (--allow-pending)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", required=True, help="directory of granary-master, granary-node")
    parser.add_argument("--repo", default=os.path.abspath(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..")), help="repository root")
    parser.add_argument("--allow-pending", action="store_true",
                        help="report the PENDING names as pending instead of failing")
    parser.add_argument("--promtool", default=shutil.which("promtool") or "promtool")
    args = parser.parse_args()
    bin_dir = os.path.abspath(args.bin_dir)
    for b in ("granary-master", "granary-node"):
        if not os.access(os.path.join(bin_dir, b), os.X_OK):
            print(f"FATAL: {os.path.join(bin_dir, b)} not built")
            return 1
    if not shutil.which(args.promtool):
        print(f"FATAL: promtool not found ({args.promtool}); scripts/install-deps.sh installs "
              "the prometheus package")
        return 1

    work = tempfile.mkdtemp(prefix="granary-deploy-check-")
    try:
        flags = {b: help_flags(os.path.join(bin_dir, b)) for b in ("granary-master", "granary-node")}
        used = check_prometheus(args.repo, args.promtool)
        for n, w in check_dashboard(args.repo, args.promtool, work).items():
            used.setdefault(n, w)
        check_kubernetes(args.repo, flags)
        check_systemd(args.repo, bin_dir, flags, work)
        check_live_names(bin_dir, work, used, args.allow_pending)
    finally:
        if os.environ.get("GRANARY_IT_KEEP_TMP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{CHECKS - FAILURES}/{CHECKS} checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
