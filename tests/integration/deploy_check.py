#!/usr/bin/env python3
"""deploy_check: checks the deployment examples in deploy/ against the
duplex binary that will run them, so that they cannot drift from it.

    deploy_check.py DUPLEX_BIN ROOT

Kubernetes (ROOT/deploy/kubernetes/*.yaml), systemd (ROOT/deploy/systemd/:
*.service units and the *.env files they read) and the commands of
ROOT/README.md's "Running on several hosts" are parsed, every duplex
command line in them is rebuilt as the pod or unit would run it (environment
variables, ConfigMap values, systemd specifiers and EnvironmentFile
expanded; `sh -c` scripts split into commands), and:

  - every --flag given to duplex exists in `duplex CMD --help` of that
    binary (or, until the branches that add them are merged, in
    PENDING_FLAGS below);
  - every port agrees: --port/--kv-port with containerPort, Services'
    port/targetPort with the pods they select, probes and scrape
    annotations with the HTTP port, --advertise-url and drain URLs with
    --host/--port, redis:// URLs with the Redis Service, static node URLs
    and --kv-peers with the nodes' addresses;
  - every Secret, ConfigMap, key, volume and credential referenced exists,
    and every file a flag names lies on a volume that holds it;
  - the YAML parses.

Prints one line per problem (FILE: WHERE: WHAT) and exits 1 if there was
any, else prints a summary and exits 0.  Run by tests/integration/
itest_deploy.c, which also feeds it broken copies of deploy/. """

import glob
import ipaddress
import os
import re
import shlex
import subprocess
import sys
from urllib.parse import urlsplit

import yaml

# ---------------------------------------------------------------------------
# PENDING_FLAGS — flags of docs that exist on other branches (the router's
# Redis state; node registration, discovery and drain: issue 14), not yet in
# this binary's --help.  Delete each entry when its branch is merged: the
# check fails when a pending flag has appeared in --help, as a reminder.
# A command listed here whose --help does not exist yet (`node drain`) is
# checked against this list alone.
PENDING_FLAGS = {}  # issue 14's branches (state, registration) are all merged
# ---------------------------------------------------------------------------

GROUPS = ("model", "bench", "kv", "node")  # commands with subcommands
REDIS_FLAGS = ("--register", "--state", "--discover")
PATH_FLAGS = ("--model", "--tokenizer", "--kv-secret-file", "--internal-key-file",
              "--api-key-file", "--chat-template", "-o", "--output")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


# ---- duplex's own flags -----------------------------------------------------

_help = {}


def help_flags(binary, cmd):
    """The flags `duplex CMD --help` lists, plus the pending ones; None when
    the command has no help and nothing is pending for it."""
    if cmd in _help:
        return _help[cmd]
    r = subprocess.run([binary, *cmd.split(), "--help"], capture_output=True, text=True,
                       timeout=60)
    listed = set()
    if r.returncode == 0:
        for line in (r.stdout + r.stderr).splitlines():
            m = re.match(r"\s+(-{1,2}[A-Za-z0-9][\w-]*)", line)
            if m:
                listed.add(m.group(1))
    pending = set(PENDING_FLAGS.get(cmd, []))
    for f in sorted(pending & listed):
        problem("PENDING_FLAGS", f"{f} is in `duplex {cmd} --help` now: delete it from "
                "PENDING_FLAGS in tests/integration/deploy_check.py")
    flags = listed | pending
    _help[cmd] = flags if flags else None
    return _help[cmd]


class Invocation:
    """One duplex command line: cmd ("serve", "node drain"), its flags with
    their values (a flag given twice keeps both), and its positionals."""

    def __init__(self, where, argv):
        self.where = where
        n = 2 if len(argv) > 1 and argv[1] in GROUPS else 1
        self.cmd = " ".join(argv[1:1 + n])
        self.flags = []
        self.pos = []
        rest = argv[1 + n:]
        i = 0
        while i < len(rest):
            a = rest[i]
            if a.startswith("-") and len(a) > 1:
                val = None
                if "=" in a:
                    a, val = a.split("=", 1)
                elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                    val = rest[i + 1]
                    i += 1
                self.flags.append((a, val))
            else:
                self.pos.append(a)
            i += 1

    def get(self, flag):
        for f, v in self.flags:
            if f == flag:
                return v
        return None

    def check_flags(self, binary):
        known = help_flags(binary, self.cmd)
        if known is None:
            problem(self.where, f"`duplex {self.cmd}`: no such command (its --help fails)")
            return
        for f, _ in self.flags:
            if f not in known:
                problem(self.where, f"`duplex {self.cmd} {f}`: no such flag in "
                        f"`duplex {self.cmd} --help`")


def duplex_commands(where, argv):
    """The duplex invocations in argv: itself, or the commands of a
    `sh -c SCRIPT` (split at ; && || | and newlines)."""
    if not argv:
        return []
    if os.path.basename(argv[0]) in ("sh", "bash") and len(argv) >= 3 and argv[1] == "-c":
        lex = shlex.shlex(argv[2], posix=True, punctuation_chars=";&|")
        lex.whitespace_split = True
        out, cur = [], []
        for tok in list(lex) + [";"]:
            if tok and set(tok) <= set(";&|"):
                out += duplex_commands(where, cur)
                cur = []
            else:
                cur.append(tok)
        return out
    if os.path.basename(argv[0]) == "duplex":
        return [Invocation(where, argv)]
    return []


def url_hostport(where, url, schemes):
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as e:
        problem(where, f"'{url}': {e}")
        return None, None
    if u.scheme not in schemes or not u.hostname or port is None:
        problem(where, f"'{url}': want {'|'.join(schemes)}://HOST:PORT")
        return None, None
    return u.hostname, port


# ---- Kubernetes ---------------------------------------------------------------

class K8s:
    def __init__(self, folder, binary):
        self.folder = folder
        self.binary = binary
        self.docs = []  # (file, doc)
        for path in sorted(glob.glob(os.path.join(folder, "*.yaml"))):
            name = os.path.relpath(path, os.path.dirname(folder))
            try:
                with open(path) as f:
                    for d in yaml.safe_load_all(f):
                        if d is not None:
                            self.docs.append((name, d))
            except yaml.YAMLError as e:
                problem(name, f"does not parse: {e}")
        self.of = {}
        for name, d in self.docs:
            if not isinstance(d, dict) or "kind" not in d:
                problem(name, "a document without a kind")
                continue
            key = (d["kind"], d.get("metadata", {}).get("name"))
            if key in self.of and d["kind"] != "Kustomization":
                problem(name, f"{key[0]} {key[1]} defined twice")
            self.of[key] = (name, d)

    def get(self, kind, name):
        return self.of.get((kind, name), (None, None))[1]

    def workloads(self):
        for name, d in self.docs:
            if isinstance(d, dict) and d.get("kind") in WORKLOADS:
                yield name, d

    def check(self):
        self.check_kustomization()
        self.nodes = []  # (file, invocation) of `serve`
        self.routers = []
        for name, w in self.workloads():
            self.check_workload(name, w)
        for name, d in self.docs:
            if isinstance(d, dict) and d.get("kind") == "Service":
                self.check_service(name, d)
        self.check_redis_urls()
        if not self.nodes or not self.routers:
            problem(self.folder, "no duplex serve or no duplex router found")

    def check_kustomization(self):
        k = self.get("Kustomization", None)
        if k is None:
            return
        listed = set(k.get("resources", []))
        present = {os.path.basename(p) for p in glob.glob(os.path.join(self.folder, "*.yaml"))}
        present.discard("kustomization.yaml")
        for r in sorted(listed - present):
            problem("kustomization.yaml", f"resource {r} does not exist")
        for r in sorted(present - listed):
            problem("kustomization.yaml", f"{r} is not among its resources")

    # -- env: $(VAR) as the kubelet expands it
    def env_of(self, where, c):
        env = {}
        for e in c.get("env", []):
            n = e["name"]
            if "value" in e:
                env[n] = self.expand(f"{where}: env {n}", str(e["value"]), env)
                continue
            vf = e.get("valueFrom", {})
            if "fieldRef" in vf:
                env[n] = "<" + vf["fieldRef"]["fieldPath"] + ">"
            elif "configMapKeyRef" in vf:
                env[n] = self.ref_value(f"{where}: env {n}", "ConfigMap", vf["configMapKeyRef"])
            elif "secretKeyRef" in vf:
                self.ref_value(f"{where}: env {n}", "Secret", vf["secretKeyRef"])
                env[n] = "<secret>"
            else:
                problem(where, f"env {n}: neither a value nor a valueFrom this check knows")
        return env

    def ref_value(self, where, kind, ref):
        obj = self.get(kind, ref.get("name"))
        if obj is None:
            problem(where, f"{kind} {ref.get('name')} does not exist")
            return ""
        data = {**obj.get("data", {}), **obj.get("stringData", {})}
        if ref.get("key") not in data:
            problem(where, f"{kind} {ref.get('name')} has no key {ref.get('key')}")
            return ""
        return str(data[ref["key"]])

    def expand(self, where, s, env):
        def sub(m):
            if m.group(1) not in env:
                problem(where, f"$({m.group(1)}) is not an environment variable defined before it")
                return m.group(0)
            return env[m.group(1)]
        return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)

    def check_workload(self, name, w):
        kind, wname = w["kind"], w["metadata"]["name"]
        spec = w["spec"]
        tmpl = spec["template"]
        labels = tmpl.get("metadata", {}).get("labels", {})
        sel = spec.get("selector", {}).get("matchLabels", {})
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            problem(f"{name}: {kind} {wname}", "selector.matchLabels does not match the pod labels")
        pod = tmpl["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for v in volumes.values():
            if "secret" in v and self.get("Secret", v["secret"].get("secretName")) is None:
                problem(f"{name}: {kind} {wname}: volume {v['name']}",
                        f"Secret {v['secret'].get('secretName')} does not exist")
            if "configMap" in v and self.get("ConfigMap", v["configMap"].get("name")) is None:
                problem(f"{name}: {kind} {wname}: volume {v['name']}",
                        f"ConfigMap {v['configMap'].get('name')} does not exist")
        written = {}  # (volume, path inside it) written by an initContainer's -o
        for c in pod.get("initContainers", []):
            for inv in self.container(name, w, c, volumes, None):
                out = inv.get("-o") or inv.get("--output")
                if out:
                    vol = self.volume_of(c, out)
                    if vol:
                        written[vol] = written.get(vol, set()) | {self.inside(c, out)}
        for c in pod.get("containers", []):
            for inv in self.container(name, w, c, volumes, written):
                if inv.cmd == "serve":
                    self.nodes.append((name, w, inv))
                elif inv.cmd == "router":
                    self.routers.append((name, w, inv))

    def mount_of(self, c, path):
        best = None
        for m in c.get("volumeMounts", []):
            mp = m["mountPath"].rstrip("/")
            if path.startswith(mp + "/") and (best is None or len(mp) > len(best["mountPath"])):
                best = m
        return best

    def volume_of(self, c, path):
        m = self.mount_of(c, path)
        return m["name"] if m else None

    def inside(self, c, path):
        m = self.mount_of(c, path)
        return path[len(m["mountPath"].rstrip("/")) + 1:]

    def container(self, name, w, c, volumes, written):
        """Checks one container; returns its duplex invocations."""
        where = f"{name}: {w['kind']} {w['metadata']['name']}: container {c['name']}"
        env = self.env_of(where, c)
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                problem(where, f"volumeMount {m['name']}: no such volume in the pod")
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        argv = [self.expand(where, str(a), env) for a in c.get("command", []) + c.get("args", [])]
        invs = duplex_commands(where, argv)
        hooks = []
        for hook in ("preStop", "postStart"):
            cmd = c.get("lifecycle", {}).get(hook, {}).get("exec", {}).get("command")
            if cmd:
                hooks += duplex_commands(f"{where}: {hook}",
                                         [self.expand(where, str(a), env) for a in cmd])
        for inv in invs + hooks:
            inv.check_flags(self.binary)
            self.check_files(where, c, inv, volumes, written)
        main = next((i for i in invs if i.cmd in ("serve", "router")), None)
        if main is None:
            return invs
        http = self.port_flag(where, main, "--port", ports)
        if main.cmd == "serve":
            self.port_flag(where, main, "--kv-port", ports)
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            p = c.get(probe)
            if not p:
                if probe != "startupProbe":
                    problem(where, f"no {probe}")
                continue
            get = p.get("httpGet")
            if not get:
                problem(where, f"{probe}: not an httpGet of /health")
                continue
            if get.get("path") != "/health":
                problem(where, f"{probe}: path {get.get('path')}, want /health")
            if self.resolve_port(where + f": {probe}", get.get("port"), ports) != http:
                problem(where, f"{probe}: port {get.get('port')} is not the HTTP port {http}")
        ann = w["spec"]["template"].get("metadata", {}).get("annotations", {})
        if str(ann.get("prometheus.io/scrape")) != "true":
            problem(where, "no prometheus.io/scrape: \"true\" annotation on the pod")
        if str(ann.get("prometheus.io/port")) != str(http):
            problem(where, f"prometheus.io/port {ann.get('prometheus.io/port')} is not the HTTP "
                    f"port {http}")
        if ann.get("prometheus.io/path") != "/metrics":
            problem(where, f"prometheus.io/path {ann.get('prometheus.io/path')}, want /metrics")
        if not c.get("resources", {}).get("requests"):
            problem(where, "no resource requests")
        for inv in hooks:
            if inv.cmd == "node drain":
                self.check_drain(where, inv, http)
        if main.cmd == "serve":
            self.check_node_addresses(where, w, main, ports)
            if not any(i.cmd == "node drain" for i in hooks):
                problem(where, "no preStop that drains the node (duplex node drain)")
        return invs

    def port_flag(self, where, inv, flag, ports):
        v = inv.get(flag)
        if v is None or not v.isdigit():
            problem(where, f"`duplex {inv.cmd}` without a fixed {flag}")
            return None
        if int(v) not in ports.values():
            problem(where, f"{flag} {v} is not a containerPort ({sorted(ports.values())})")
        return int(v)

    def resolve_port(self, where, port, ports):
        if isinstance(port, int):
            if port not in ports.values():
                problem(where, f"port {port} is not a containerPort")
            return port
        if port not in ports:
            problem(where, f"port '{port}' names no containerPort")
            return None
        return ports[port]

    def check_drain(self, where, inv, http):
        if not inv.pos:
            problem(where, "duplex node drain without the node's URL")
            return
        host, port = url_hostport(where, inv.pos[0], ("http",))
        if port is not None and port != http:
            problem(where, f"drain URL {inv.pos[0]}: port {port} is not the node's --port {http}")

    def check_files(self, where, c, inv, volumes, written):
        for flag, val in inv.flags:
            if flag not in PATH_FLAGS or not val or not val.startswith("/"):
                continue
            m = self.mount_of(c, val)
            if m is None:
                problem(where, f"{flag} {val}: on no volume mounted in the container")
                continue
            vol = volumes.get(m["name"], {})
            rel = self.inside(c, val)
            if "secret" in vol:
                s = self.get("Secret", vol["secret"].get("secretName")) or {}
                keys = {**s.get("data", {}), **s.get("stringData", {})}
                items = vol["secret"].get("items")
                names = {i["path"] for i in items} if items else set(keys)
                if rel not in names:
                    problem(where, f"{flag} {val}: Secret {vol['secret'].get('secretName')} "
                            f"has no key {rel}")
            elif "emptyDir" in vol and written is not None:
                if rel not in written.get(m["name"], set()):
                    problem(where, f"{flag} {val}: no initContainer writes it to volume "
                            f"{m['name']}")

    def headless_service_of(self, w):
        name = w["spec"].get("serviceName")
        svc = self.get("Service", name)
        return name, svc

    def check_node_addresses(self, where, w, inv, ports):
        """--advertise-url and --kv-host: the pod's stable DNS name through
        its StatefulSet's headless Service, whose ports lead to --port and
        --kv-port."""
        if w["kind"] != "StatefulSet":
            problem(where, "nodes run as a StatefulSet (stable names, stable KV addresses)")
            return
        sname, svc = self.headless_service_of(w)
        if svc is None:
            problem(where, f"serviceName {sname}: no such Service")
            return
        if svc["spec"].get("clusterIP") != "None":
            problem(where, f"Service {sname} is not headless (clusterIP: None)")
        want = f"<metadata.name>.{sname}.<metadata.namespace>.svc."
        adv = inv.get("--advertise-url")
        if adv is None:
            problem(where, "no --advertise-url (the node listens on 0.0.0.0)")
        else:
            host, port = url_hostport(where + ": --advertise-url", adv, ("http",))
            if host is not None and not host.startswith(want):
                problem(where, f"--advertise-url {adv}: host is not the pod's name {want}...")
            if port is not None and str(port) != inv.get("--port"):
                problem(where, f"--advertise-url {adv}: port is not --port {inv.get('--port')}")
        kvh = inv.get("--kv-host")
        if kvh is None or not kvh.startswith(want):
            problem(where, f"--kv-host {kvh}: not the pod's stable name {want}...")
        targets = set()
        for p in svc["spec"].get("ports", []):
            t = p.get("targetPort", p.get("port"))
            targets.add(ports.get(t) if isinstance(t, str) else t)
            if p.get("port") != (ports.get(t) if isinstance(t, str) else t):
                problem(where, f"Service {sname} port {p.get('port')} is not the pod's port "
                        f"{t}: the pods' DNS names must reach --port/--kv-port as given")
        for flag in ("--port", "--kv-port"):
            if inv.get(flag) and int(inv.get(flag)) not in targets:
                problem(where, f"Service {sname} has no port leading to {flag} {inv.get(flag)}")

    def check_service(self, name, svc):
        sname = svc["metadata"]["name"]
        where = f"{name}: Service {sname}"
        sel = svc["spec"].get("selector", {})
        pods = [(n, w) for n, w in self.workloads()
                if sel and all(w["spec"]["template"].get("metadata", {}).get("labels", {})
                               .get(k) == v for k, v in sel.items())]
        if not pods:
            problem(where, "its selector matches no pod")
        for n, w in pods:
            conts = w["spec"]["template"]["spec"].get("containers", [])
            ports = {}
            for c in conts:
                ports.update({p.get("name"): p["containerPort"] for p in c.get("ports", [])})
            for p in svc["spec"].get("ports", []):
                t = p.get("targetPort", p.get("port"))
                if (t not in ports) if isinstance(t, str) else (t not in ports.values()):
                    problem(where, f"port {p.get('port')}: targetPort {t} is no containerPort "
                            f"of {w['kind']} {w['metadata']['name']}")
        if svc["spec"].get("clusterIP") == "None":
            for n, w in pods:
                if w["kind"] == "StatefulSet" and w["spec"].get("serviceName") != sname:
                    problem(where, f"headless Service of StatefulSet {w['metadata']['name']}, "
                            f"whose serviceName is {w['spec'].get('serviceName')}")

    def check_redis_urls(self):
        urls = set()
        for name, w, inv in self.nodes + self.routers:
            for flag in REDIS_FLAGS:
                v = inv.get(flag)
                if v is None:
                    continue
                urls.add(v)
                where = f"{name}: {w['kind']} {w['metadata']['name']}: {flag}"
                host, port = url_hostport(where, v, ("redis",))
                svc = self.get("Service", host)
                if host is not None and svc is None:
                    problem(where, f"{v}: no Service named {host}")
                elif svc is not None and port not in [p.get("port") for p in
                                                      svc["spec"].get("ports", [])]:
                    problem(where, f"{v}: Service {host} has no port {port}")
        regs = {inv.get("--register") for _, _, inv in self.nodes}
        discs = {inv.get("--discover") for _, _, inv in self.routers}
        if regs != discs or None in regs:
            problem(self.folder, f"nodes register at {sorted(map(str, regs))} but routers "
                    f"discover at {sorted(map(str, discs))}")


# ---- systemd ------------------------------------------------------------------

def parse_unit(path, where):
    """{section: [(key, value)]} with continuation lines joined."""
    sections, cur, pending = {}, None, ""
    with open(path) as f:
        lines = f.read().split("\n")
    for raw in lines:
        s = raw.strip()
        if not s or s[0] in "#;":  # comments may sit inside a continued line too
            continue
        s = pending + s
        pending = ""
        if s.endswith("\\"):
            pending = s[:-1] + " "
            continue
        if s.startswith("[") and s.endswith("]"):
            cur = sections.setdefault(s[1:-1], [])
        elif "=" in s and cur is not None:
            k, v = s.split("=", 1)
            cur.append((k.strip(), v.strip()))
        else:
            problem(where, f"cannot parse line: {s}")
    return sections


def parse_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            s = line.strip()
            if not s or s[0] in "#;":
                continue
            k, _, v = s.partition("=")
            v = v.strip()
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                v = v[1:-1]
            env[k.strip()] = v
    return env


RUNTIME_VARS = {"MAINPID": "<mainpid>"}


def systemd_argv(where, line, env, instance, unit):
    """A command line as systemd runs it: specifiers, ${VAR} inside words,
    $VAR alone as a word split on white space."""
    line = line.lstrip("-@:+!")
    line = line.replace("%i", instance).replace("%d", f"/run/credentials/{unit}")
    line = line.replace("%n", unit).replace("%%", "%")

    def lookup(name):
        if name in env:
            return env[name]
        if name in RUNTIME_VARS:
            return RUNTIME_VARS[name]
        problem(where, f"${{{name}}} is set by no EnvironmentFile/Environment")
        return ""
    argv = []
    for word in shlex.split(line):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            argv += lookup(m.group(1)).split()
        else:
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: lookup(m.group(1)),
                               word))
    return argv


class Systemd:
    def __init__(self, folder, binary):
        self.folder = folder
        self.binary = binary
        self.nodes = []  # (where, role, invocation)
        self.routers = []

    def check(self):
        units = sorted(glob.glob(os.path.join(self.folder, "*.service")))
        if not units:
            problem(self.folder, "no unit files")
        model_out = set()
        models = []
        for path in units:
            model_out |= self.check_unit(path, models)
        for where, m in models:
            if m not in model_out:
                problem(where, f"--model/--tokenizer {m}: no unit writes it (duplex model synth -o)")
        self.check_cluster()

    def env_files(self, where, unit_name, pattern, instance_unit):
        """The example env files standing for EnvironmentFile=pattern:
        (instance, env) pairs."""
        base = os.path.basename(pattern)
        if instance_unit:
            rx = re.escape(base).replace("%i", "(.+)")
            found = []
            for p in sorted(glob.glob(os.path.join(self.folder, "*.env"))):
                m = re.fullmatch(rx, os.path.basename(p))
                if m:
                    found.append((m.group(1), parse_env(p)))
            if not found:
                problem(where, f"EnvironmentFile={pattern}: no example {base.replace('%i', '*')} "
                        f"beside the unit")
            return found
        p = os.path.join(self.folder, base)
        if not os.path.exists(p):
            problem(where, f"EnvironmentFile={pattern}: no example {base} beside the unit")
            return []
        return [("", parse_env(p))]

    def check_unit(self, path, models):
        name = os.path.basename(path)
        where = f"systemd/{name}"
        sec = parse_unit(path, where)
        svc = dict(sec.get("Service", []))
        svc_all = sec.get("Service", [])
        templ = name.endswith("@.service")
        envfiles = [v for k, v in svc_all if k == "EnvironmentFile"]
        instances = [("", {})]
        for ef in envfiles:
            instances = self.env_files(where, name, ef.lstrip("-"), templ)
        creds = {v.split(":", 1)[0] for k, v in svc_all if k == "LoadCredential"}
        for k, v in sec.get("Unit", []):
            if k in ("Requires", "After", "Wants", "BindsTo"):
                for u in v.split():
                    if u.startswith("duplex") and not os.path.exists(os.path.join(self.folder, u)):
                        problem(where, f"{k}={u}: no such unit here")
        long_running = svc.get("Type", "simple") != "oneshot"
        if long_running and svc.get("Restart") not in ("on-failure", "always"):
            problem(where, "no Restart=on-failure")
        written = set()
        for inst, env0 in instances:
            env = dict(env0)
            for k, v in svc_all:
                if k == "Environment":
                    for kv in shlex.split(v):
                        a, _, b = kv.partition("=")
                        env[a] = b
            unit = name.replace("@.", f"@{inst}.")
            iw = f"{where} ({unit})" if inst else where
            used_creds = set()
            invs = {}
            for key in ("ExecStartPre", "ExecStart", "ExecStop", "ExecStartPost"):
                for k, line in svc_all:
                    if k != key:
                        continue
                    argv = systemd_argv(f"{iw}: {key}", line, env, inst, unit)
                    for a in argv:
                        used_creds |= set(re.findall(
                            re.escape(f"/run/credentials/{unit}/") + r"([\w.-]+)", a))
                    for inv in duplex_commands(f"{iw}: {key}", argv):
                        inv.check_flags(self.binary)
                        invs.setdefault(key, []).append(inv)
            for c in sorted(used_creds - creds):
                problem(iw, f"uses credential {c} (%d/{c}) without LoadCredential={c}:...")
            for c in sorted(creds - used_creds):
                problem(iw, f"LoadCredential={c} is never used")
            for inv in invs.get("ExecStart", []):
                if inv.cmd == "model synth":
                    written.add(inv.get("-o") or inv.get("--output"))
                for flag in ("--model", "--tokenizer"):
                    if inv.get(flag):
                        models.append((iw, inv.get(flag)))
                if inv.cmd == "serve":
                    self.check_node(iw, inv, invs.get("ExecStop", []))
                elif inv.cmd == "router":
                    self.routers.append((iw, inv))
                    if inv.get("--port") is None:
                        problem(iw, "router without --port")
        return written

    def check_node(self, where, inv, stops):
        host, port = inv.get("--host"), inv.get("--port")
        if not port or not port.isdigit() or not inv.get("--kv-port"):
            problem(where, "node without a fixed --port and --kv-port")
        adv = inv.get("--advertise-url")
        if adv:
            h, p = url_hostport(where + ": --advertise-url", adv, ("http",))
            if (h, str(p)) != (host, port):
                problem(where, f"--advertise-url {adv} is not --host {host} --port {port}")
        drains = [i for i in stops if i.cmd == "node drain"]
        if not drains:
            problem(where, "no ExecStop that drains the node (duplex node drain)")
        for d in drains:
            h, p = url_hostport(where + ": ExecStop", d.pos[0] if d.pos else "", ("http",))
            if h is not None and (str(p) != port or h not in (host, "127.0.0.1", "localhost")):
                problem(where, f"ExecStop drains {d.pos[0]}, not the node at {host}:{port}")
        role = inv.get("--role")
        self.nodes.append((where, role, inv))

    def check_cluster(self):
        """Across the units of the example: the nodes can pull from each
        other (--kv-peers covers the others' --kv-host), they register where
        the routers discover, and static node URLs name real nodes."""
        for where, role, inv in self.nodes:
            peers = (inv.get("--kv-peers") or "").split(",")
            for w2, r2, other in self.nodes:
                if other is inv or r2 == role:
                    continue
                kvh = other.get("--kv-host") or other.get("--host")
                if not any(peer_covers(p, kvh, other.get("--kv-port")) for p in peers if p):
                    problem(where, f"--kv-peers {inv.get('--kv-peers')} does not cover the "
                            f"{r2} node's KV address {kvh}:{other.get('--kv-port')} ({w2})")
        regs = {inv.get("--register") for _, _, inv in self.nodes}
        discs = {inv.get("--discover") for _, inv in self.routers}
        if regs != discs or None in regs:
            problem(self.folder, f"nodes register at {sorted(map(str, regs))} but routers "
                    f"discover at {sorted(map(str, discs))}")
        for where, inv in [(w, i) for w, _, i in self.nodes] + self.routers:
            for flag in REDIS_FLAGS:
                if inv.get(flag):
                    url_hostport(f"{where}: {flag}", inv.get(flag), ("redis",))
        urls = {f"http://{i.get('--host')}:{i.get('--port')}": r for _, r, i in self.nodes}
        for where, inv in self.routers:
            for flag, role in (("--prefill", "prefill"), ("--decode", "decode")):
                for u in (inv.get(flag) or "").split(","):
                    if u and urls.get(u.rstrip("/")) != role:
                        problem(where, f"{flag} {u}: no {role} node listens there")


def peer_covers(entry, host, port):
    """Whether a --kv-peers entry (HOST, HOST:PORT, [V6]:PORT, ADDR/BITS)
    allows host:port."""
    try:
        if "/" in entry:
            return ipaddress.ip_address(host) in ipaddress.ip_network(entry)
        m = re.fullmatch(r"\[(.+)\]:(\d+)|([^:]+):(\d+)", entry)
        if m:
            h, p = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            return h == host and p == str(port)
        return entry == host
    except ValueError:
        return False


# ---- README ---------------------------------------------------------------------

README_SECTION = "## Running on several hosts"


def check_readme(path, binary):
    """The duplex commands of the README's multi-host section: their flags
    (those code blocks need several hosts, so no test runs them)."""
    where = os.path.basename(path)
    with open(path) as f:
        text = f.read()
    if README_SECTION not in text:
        problem(where, f"no section '{README_SECTION}'")
        return 0
    sec = text.split(README_SECTION, 1)[1].split("\n## ", 1)[0]
    n = 0
    for block in re.findall(r"```sh\n(.*?)\n```", sec, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                invs = duplex_commands(f"{where}: `{line.strip()[:40]}...`", ["sh", "-c", line])
            except ValueError as e:
                problem(where, f"cannot split '{line}': {e}")
                continue
            for inv in invs:
                inv.check_flags(binary)
                n += 1
    if n == 0:
        problem(where, f"no duplex command in '{README_SECTION}'")
    return n


def main():
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    binary, root = sys.argv[1], sys.argv[2]
    folder = os.path.join(root, "deploy")
    k8s = K8s(os.path.join(folder, "kubernetes"), binary)
    k8s.check()
    sd = Systemd(os.path.join(folder, "systemd"), binary)
    sd.check()
    n_readme = check_readme(os.path.join(root, "README.md"), binary)
    for p in problems:
        print(p)
    if problems:
        print(f"deploy_check: {len(problems)} problem(s)")
        return 1
    n_flags = sum(len(i.flags) for _, _, i in k8s.nodes + k8s.routers)
    print(f"deploy_check: ok: {len(k8s.docs)} Kubernetes objects, "
          f"{len(k8s.nodes)} node and {len(k8s.routers)} router containers ({n_flags} flags), "
          f"{len(sd.nodes)} node and {len(sd.routers)} router units, {n_readme} README "
          f"commands; pending flags: "
          + ", ".join(f"{c} {' '.join(f)}" for c, f in PENDING_FLAGS.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
