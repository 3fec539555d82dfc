#!/usr/bin/python3
"""The Kubernetes deployment as shipped (deploy/kubernetes): keys made by its
make-keys.sh with this build's `rankscope keygen`, the manifests built by the
real `kubectl kustomize`, and what they ask for checked:
  - every object in namespace rankscope; the agent a DaemonSet with hostPID,
    the node name from the downward API, exactly the capabilities
    deploy/kubernetes/agent.yaml says it needs (never SYS_ADMIN, never
    privileged), the BTF, tracefs, cgroup and container-runtime mounts, and
    no access to the collector's secret key;
  - the collector a StatefulSet with a PersistentVolumeClaim, its key from the
    Secret and its allow-list from the ConfigMap, at the paths its flags name;
  - every flag given to either program is one it takes (its --help);
  - the allow-list holds every node's and the client's public key, and the
    real collector started with those keys admits them all.
Uses Debian's python3 with python3-yaml (installed by `make test`).

  tests/deploy/verify_kubernetes.py BUILD_DIR
"""
import base64
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import yaml

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
AGENT_CAPS = {"BPF", "PERFMON", "SYS_PTRACE", "SYS_RESOURCE", "DAC_READ_SEARCH"}
NODES = ["gpu-1", "gpu-2"]


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def flags_of(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return set(re.findall(r"--([a-z][a-z0-9-]*)", out.stdout + out.stderr))


def check_args(name, args, known):
    for arg in args:
        flag = re.match(r"--([a-z][a-z0-9-]*)", arg)
        if not flag or flag.group(1) not in known:
            fail("%s is given %r, which it does not take" % (name, arg))


def arg_value(args, flag):
    for arg in args:
        if arg.startswith("--" + flag + "="):
            return arg.split("=", 1)[1]
    fail("no --%s in %r" % (flag, args))


def mounted_path(container, volumes, path):
    """The volume whose mount holds `path`."""
    for m in container.get("volumeMounts", []):
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
            return volumes[m["name"]]
    fail("%s is in no volume of %s" % (path, container["name"]))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_nccl_profiler(kubectl, deploy, plain):
    """The nccl-profiler component added to the same deployment: the agent's
    init container puts the plugin where the policy's pods mount it and
    NCCL_PROFILER_PLUGIN names it; only opted-in namespaces, never a pod
    that names its own plugin; nothing else changes."""
    with open(os.path.join(deploy, "kustomization.yaml"), "a") as f:
        f.write("components:\n  - nccl-profiler\n")
    built = subprocess.run([kubectl, "kustomize", deploy], capture_output=True, text=True)
    if built.returncode != 0:
        fail("kubectl kustomize with the nccl-profiler component: " + built.stderr)
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(built.stdout) if o}
    added = set(objects) - set(plain)
    want = {("MutatingAdmissionPolicy", "rankscope-nccl-profiler"),
            ("MutatingAdmissionPolicyBinding", "rankscope-nccl-profiler")}
    if added != want:
        fail("the nccl-profiler component adds %s, not %s" % (sorted(added), sorted(want)))
    policy = objects[("MutatingAdmissionPolicy", "rankscope-nccl-profiler")]
    binding = objects[("MutatingAdmissionPolicyBinding", "rankscope-nccl-profiler")]
    if binding["spec"]["policyName"] != policy["metadata"]["name"]:
        fail("the binding names another policy")
    spec = policy["spec"]
    match = spec["matchConstraints"]
    if match["namespaceSelector"] != {"matchLabels": {"rankscope.io/nccl-profiler": "enabled"}}:
        fail("the policy is not opt-in per namespace: %r" % match["namespaceSelector"])
    if match["resourceRules"] != [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                   "resources": ["pods"]}]:
        fail("the policy mutates more than pods being created: %r" % match["resourceRules"])
    if spec.get("failurePolicy") != "Ignore":
        fail("a pod must never be refused for want of the plugin (failurePolicy Ignore)")
    if not any("NCCL_PROFILER_PLUGIN" in c["expression"] for c in spec.get("matchConditions", [])):
        fail("the policy does not leave alone a pod that names its own profiler plugin")
    if not any("envFrom" in c["expression"] for c in spec.get("matchConditions", [])):
        fail("the policy does not leave alone a pod whose envFrom may name its own profiler plugin")
    expression = spec["mutations"][0]["applyConfiguration"]["expression"]
    env = re.search(r'name: "NCCL_PROFILER_PLUGIN",\s*value: "([^"]+)"', expression)
    host = re.search(r'hostPath\{path: "([^"]+)"', expression)
    mount = re.search(r'mountPath: "([^"]+)",\s*readOnly: true', expression)
    if not env or not host or not mount:
        fail("the policy's mutation does not set the plugin, its host folder and a read-only mount")
    if os.path.dirname(env.group(1)) != mount.group(1) or mount.group(1) != host.group(1):
        fail("NCCL_PROFILER_PLUGIN=%s is not in the folder mounted from the node (%s at %s)" %
             (env.group(1), host.group(1), mount.group(1)))
    # The agent's init container writes that file on the node.
    ds = objects[("DaemonSet", "rankscope-agent")]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in ds["volumes"]}
    inits = ds.get("initContainers", [])
    if len(inits) != 1:
        fail("the agent has %d init containers, not the plugin's installer" % len(inits))
    init = inits[0]
    script = " ".join(init["command"])
    target = re.search(r"mv -f \S+ (\S+)", script)
    if not target or target.group(1) != env.group(1):
        fail("the installer does not put the plugin at %s: %s" % (env.group(1), script))
    if mounted_path(init, volumes, target.group(1)).get("hostPath", {}).get("path") != host.group(1):
        fail("the installer's %s is not the node's %s" % (target.group(1), host.group(1)))
    if init.get("securityContext", {}).get("privileged"):
        fail("the plugin's installer must not be privileged")
    plain_ds = plain[("DaemonSet", "rankscope-agent")]["spec"]["template"]["spec"]
    if ds["containers"] != plain_ds["containers"]:
        fail("the component changes the agent's container")


def main():
    build = os.path.abspath(sys.argv[1])
    kubectl = shutil.which("kubectl")
    if not kubectl:
        fail("kubectl is missing (this machine's image provides it; `kubectl kustomize` works offline)")
    work = tempfile.mkdtemp(prefix="rankscope-k8s-")
    try:
        deploy = os.path.join(work, "kubernetes")
        shutil.copytree(os.path.join(SRC, "deploy", "kubernetes"), deploy,
                        ignore=shutil.ignore_patterns("keys"))
        subprocess.run([os.path.join(deploy, "make-keys.sh"), "--rankscope", os.path.join(build, "bin", "rankscope")]
                       + NODES, check=True, stdout=subprocess.DEVNULL)
        built = subprocess.run([kubectl, "kustomize", deploy], capture_output=True, text=True)
        if built.returncode != 0:
            fail("kubectl kustomize: " + built.stderr)
        objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(built.stdout) if o}
        for (kind, name), o in objects.items():
            if kind != "Namespace" and o["metadata"].get("namespace") != "rankscope":
                fail("%s %s is not in namespace rankscope" % (kind, name))
        for want in [("Namespace", "rankscope"), ("Service", "rankscope-collector"),
                     ("StatefulSet", "rankscope-collector"), ("DaemonSet", "rankscope-agent"),
                     ("Secret", "rankscope-collector-key"), ("ConfigMap", "rankscope-collector-pub"),
                     ("ConfigMap", "rankscope-allowed")]:
            if want not in objects:
                fail("no %s %s in the build" % want)

        # The agent.
        ds = objects[("DaemonSet", "rankscope-agent")]["spec"]["template"]["spec"]
        if not ds.get("hostPID"):
            fail("the agent needs hostPID to see the jobs' processes")
        agent = ds["containers"][0]
        sc = agent.get("securityContext", {})
        if sc.get("privileged"):
            fail("the agent must not be privileged")
        caps = set(sc.get("capabilities", {}).get("add", []))
        if caps != AGENT_CAPS:
            fail("the agent's capabilities are %s, not %s" % (sorted(caps), sorted(AGENT_CAPS)))
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            fail("the agent does not drop the capabilities it does not need")
        env = {e["name"]: e for e in agent.get("env", [])}
        if env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
            fail("NODE_NAME does not come from spec.nodeName")
        agent_args = agent["args"]
        check_args("rankscope-agent", agent_args, flags_of(os.path.join(build, "bin", "rankscope-agent")))
        if arg_value(agent_args, "node") != "$(NODE_NAME)":
            fail("the agent's --node is not the node's name")
        volumes = {v["name"]: v for v in ds["volumes"]}
        mounts = {m["mountPath"] for m in agent["volumeMounts"]}
        for path in ["/sys/kernel/btf", "/sys/kernel/tracing", "/sys/fs/cgroup", "/host/run/containerd"]:
            if path not in mounts:
                fail("the agent does not mount " + path)
        if arg_value(agent_args, "container-state-root") != "/host":
            fail("the agent's --container-state-root is not where the runtimes' state is mounted")
        if "hostPath" not in mounted_path(agent, volumes, arg_value(agent_args, "key")):
            fail("the agent's key is not the node's own (a hostPath)")
        if mounted_path(agent, volumes, arg_value(agent_args, "collector-key")).get("configMap", {}).get("name") != \
                "rankscope-collector-pub":
            fail("the agent's --collector-key is not the collector's public key")
        if any(v.get("secret") for v in volumes.values()):
            fail("the agent mounts a Secret: no secret of the cluster belongs on every node")
        service = objects[("Service", "rankscope-collector")]
        if arg_value(agent_args, "collector") != "tcp://rankscope-collector:7600" or \
                7600 not in [p["port"] for p in service["spec"]["ports"]]:
            fail("the agent does not reach the collector's Service on its agent port")

        # The collector.
        sts = objects[("StatefulSet", "rankscope-collector")]["spec"]
        if not sts.get("volumeClaimTemplates"):
            fail("the collector's database has no PersistentVolumeClaim")
        pod = sts["template"]["spec"]
        collector = pod["containers"][0]
        collector_args = collector["args"]
        check_args("rankscope-collector", collector_args, flags_of(os.path.join(build, "bin", "rankscope-collector")))
        cvolumes = {v["name"]: v for v in pod["volumes"]}
        cvolumes.update({t["metadata"]["name"]: {"pvc": True} for t in sts["volumeClaimTemplates"]})
        if mounted_path(collector, cvolumes, arg_value(collector_args, "key")).get("secret", {}).get("secretName") != \
                "rankscope-collector-key":
            fail("the collector's --key is not in the Secret")
        if mounted_path(collector, cvolumes, arg_value(collector_args, "allow") + "/x").get("configMap", {}).get(
                "name") != "rankscope-allowed":
            fail("the collector's --allow is not the allow-list ConfigMap")
        if not mounted_path(collector, cvolumes, arg_value(collector_args, "db")).get("pvc"):
            fail("the collector's --db is not on its PersistentVolumeClaim")
        named = {p["name"] for p in collector["ports"]}
        for p in service["spec"]["ports"]:
            if p["targetPort"] not in named:
                fail("the Service's port %s targets no port of the collector" % p["name"])
        # Agents reach the clock port (HelloReply.clockPort: the number the
        # collector bound) at the host they reach the agents' port at: the
        # Service must forward that same number to it.
        clock_port = int(arg_value(collector_args, "clock-listen").rsplit(":", 1)[1])
        container_ports = {p["name"]: p["containerPort"] for p in collector["ports"]}
        if not any(p["port"] == clock_port and container_ports.get(p["targetPort"]) == clock_port
                   for p in service["spec"]["ports"]):
            fail("the Service does not forward port %d to the collector's --clock-listen" % clock_port)

        # The keys: the Secret holds the collector's secret key, the allow-list
        # every node's and the client's public key, and the real collector
        # admits them all.
        secret = base64.b64decode(objects[("Secret", "rankscope-collector-key")]["data"]["collector.key"]).decode()
        if "secret-key" not in secret:
            fail("the collector's Secret holds no secret key")
        allowed = objects[("ConfigMap", "rankscope-allowed")]["data"]
        want = {"agent-%s.pub" % n for n in NODES} | {"client-ops.pub"}
        if set(allowed) != want:
            fail("the allow-list holds %s, not %s" % (sorted(allowed), sorted(want)))
        allow_dir = os.path.join(work, "allowed")
        os.mkdir(allow_dir)
        for name, text in allowed.items():
            with open(os.path.join(allow_dir, name), "w") as f:
                f.write(text)
        key = os.path.join(work, "collector.key")
        with open(key, "w") as f:
            f.write(secret)
        os.chmod(key, 0o600)
        log = os.path.join(work, "collector.log")
        with open(log, "w") as out:
            proc = subprocess.Popen([os.path.join(build, "bin", "rankscope-collector"),
                                     "--listen=tcp://127.0.0.1:%d" % free_port(),
                                     "--query=tcp://127.0.0.1:%d" % free_port(),
                                     "--db=" + os.path.join(work, "db"), "--key=" + key, "--allow=" + allow_dir],
                                    stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 20
            text = ""
            while time.time() < deadline and "key(s)" not in text and proc.poll() is None:
                time.sleep(0.1)
                text = open(log).read()
        finally:
            proc.terminate()
            proc.wait(10)
        if "allow-list %s: %d key(s)" % (allow_dir, len(want)) not in text:
            fail("the collector did not admit the %d keys:\n%s" % (len(want), text))
        check_nccl_profiler(kubectl, deploy, objects)
        print("kubernetes deployment verified: %d objects, %d keys admitted; the nccl-profiler component" %
              (len(objects), len(want)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


main()
