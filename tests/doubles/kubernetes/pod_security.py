"""The Pod Security Standards' "restricted" level, as checks over a pod spec (plain JSON).

Written from the Pod Security Standards page (kubernetes.io/docs/concepts/security/
pod-security-standards) and the admission controller that enforces it, whose checks live in
kubernetes/kubernetes staging/src/k8s.io/pod-security-admission/policy/check_<id>.go; each
function below names its check. `restricted_violations` returns "<check>: <what>" per violation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Spec = dict[str, Any]

# Baseline "Capabilities": what may be added (check_capabilities_baseline.go).
_BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
# Baseline "Sysctls": the safe set (check_sysctls.go).
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
# Restricted "Volume Types": the only volume sources allowed (check_restrictedVolumes.go).
_RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def _containers(spec: Spec) -> Iterator[Spec]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def _sc(obj: Spec) -> Spec:
    return obj.get("securityContext") or {}


def host_namespaces(spec: Spec) -> list[str]:
    """Baseline "Host Namespaces" (check_hostNamespaces.go): hostNetwork/PID/IPC unset or false."""
    return [f"spec.{k} is true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]


def privileged(spec: Spec) -> list[str]:
    """Baseline "Privileged Containers" (check_privileged.go)."""
    return [
        f"container {c['name']} is privileged"
        for c in _containers(spec)
        if _sc(c).get("privileged")
    ]


def capabilities_baseline(spec: Spec) -> list[str]:
    """Baseline "Capabilities" (check_capabilities_baseline.go): adds only from the default set."""
    return [
        f"container {c['name']} adds {cap}"
        for c in _containers(spec)
        for cap in (_sc(c).get("capabilities") or {}).get("add") or []
        if cap not in _BASELINE_CAPABILITIES
    ]


def host_process(spec: Spec) -> list[str]:
    """Baseline "HostProcess" (check_windowsHostProcess.go): windowsOptions.hostProcess unset."""
    scs = [("pod", _sc(spec))] + [(c["name"], _sc(c)) for c in _containers(spec)]
    return [
        f"{where} is a Windows HostProcess"
        for where, sc in scs
        if (sc.get("windowsOptions") or {}).get("hostProcess")
    ]


def app_armor(spec: Spec) -> list[str]:
    """Baseline "AppArmor" (check_appArmorProfile.go): the profile is never Unconfined (the pod
    annotations are checked by `restricted_violations`)."""
    scs = [("pod", _sc(spec))] + [(c["name"], _sc(c)) for c in _containers(spec)]
    return [
        f"{where} sets appArmorProfile Unconfined"
        for where, sc in scs
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined"
    ]


def host_path_volumes(spec: Spec) -> list[str]:
    """Baseline "HostPath Volumes" (check_hostPathVolumes.go)."""
    return [
        f"volume {v['name']} is a hostPath" for v in spec.get("volumes") or [] if "hostPath" in v
    ]


def host_ports(spec: Spec) -> list[str]:
    """Baseline "Host Ports" (check_hostPorts.go): hostPort unset or 0."""
    return [
        f"container {c['name']} uses hostPort {p['hostPort']}"
        for c in _containers(spec)
        for p in c.get("ports") or []
        if p.get("hostPort")
    ]


def se_linux_options(spec: Spec) -> list[str]:
    """Baseline "SELinux" (check_seLinuxOptions.go): no user or role; type only a container one."""
    allowed = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
    found = []
    for where, sc in [("pod", _sc(spec))] + [(c["name"], _sc(c)) for c in _containers(spec)]:
        options = sc.get("seLinuxOptions") or {}
        if options.get("user") or options.get("role") or options.get("type", "") not in allowed:
            found.append(f"{where} sets seLinuxOptions {options}")
    return found


def proc_mount(spec: Spec) -> list[str]:
    """Baseline "/proc Mount Type" (check_procMount.go): Default or unset."""
    return [
        f"container {c['name']} sets procMount {_sc(c)['procMount']}"
        for c in _containers(spec)
        if _sc(c).get("procMount", "Default") != "Default"
    ]


def seccomp_baseline(spec: Spec) -> list[str]:
    """Baseline "Seccomp" (check_seccompProfile_baseline.go): never Unconfined."""
    scs = [_sc(spec)] + [_sc(c) for c in _containers(spec)]
    return [
        "seccompProfile Unconfined"
        for sc in scs
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined"
    ]


def sysctls(spec: Spec) -> list[str]:
    """Baseline "Sysctls" (check_sysctls.go): only the safe set."""
    return [
        f"sysctl {s['name']} is not safe"
        for s in _sc(spec).get("sysctls") or []
        if s["name"] not in _SAFE_SYSCTLS
    ]


def restricted_volumes(spec: Spec) -> list[str]:
    """Restricted "Volume Types" (check_restrictedVolumes.go)."""
    return [
        f"volume {v['name']} has a restricted type"
        for v in spec.get("volumes") or []
        if not (set(v) - {"name"}) & _RESTRICTED_VOLUMES
    ]


def allow_privilege_escalation(spec: Spec) -> list[str]:
    """Restricted "Privilege Escalation" (check_allowPrivilegeEscalation.go): every container
    sets allowPrivilegeEscalation to false."""
    return [
        f"container {c['name']} does not set allowPrivilegeEscalation=false"
        for c in _containers(spec)
        if _sc(c).get("allowPrivilegeEscalation") is not False
    ]


def run_as_non_root(spec: Spec) -> list[str]:
    """Restricted "Running as Non-root" (check_runAsNonRoot.go): true on the pod (and no
    container sets false) or on every container."""
    pod = _sc(spec).get("runAsNonRoot")
    found = ["pod sets runAsNonRoot=false"] if pod is False else []
    for c in _containers(spec):
        value = _sc(c).get("runAsNonRoot")
        if value is False or (value is None and pod is not True):
            found.append(f"container {c['name']} may run as root")
    return found


def run_as_user(spec: Spec) -> list[str]:
    """Restricted "Running as Non-root user" (check_runAsUser.go): runAsUser never 0."""
    scs = [("pod", _sc(spec))] + [(c["name"], _sc(c)) for c in _containers(spec)]
    return [f"{where} sets runAsUser=0" for where, sc in scs if sc.get("runAsUser") == 0]


def seccomp_restricted(spec: Spec) -> list[str]:
    """Restricted "Seccomp" (check_seccompProfile_restricted.go): RuntimeDefault or Localhost,
    on the pod or on every container."""
    ok = {"RuntimeDefault", "Localhost"}
    pod = (_sc(spec).get("seccompProfile") or {}).get("type")
    found = [f"pod seccompProfile {pod}"] if pod is not None and pod not in ok else []
    for c in _containers(spec):
        kind = (_sc(c).get("seccompProfile") or {}).get("type")
        if (kind is not None and kind not in ok) or (kind is None and pod not in ok):
            found.append(f"container {c['name']} has no RuntimeDefault or Localhost seccomp")
    return found


def capabilities_restricted(spec: Spec) -> list[str]:
    """Restricted "Capabilities" (check_capabilities_restricted.go): every container drops ALL
    and adds nothing but NET_BIND_SERVICE."""
    found = []
    for c in _containers(spec):
        caps = _sc(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"container {c['name']} does not drop ALL capabilities")
        found += [
            f"container {c['name']} adds {cap}"
            for cap in caps.get("add") or []
            if cap != "NET_BIND_SERVICE"
        ]
    return found


RESTRICTED: tuple[Callable[[Spec], list[str]], ...] = (
    host_namespaces,
    privileged,
    capabilities_baseline,
    host_process,
    app_armor,
    host_path_volumes,
    host_ports,
    se_linux_options,
    proc_mount,
    seccomp_baseline,
    sysctls,
    restricted_volumes,
    allow_privilege_escalation,
    run_as_non_root,
    run_as_user,
    seccomp_restricted,
    capabilities_restricted,
)


def restricted_violations(pod_spec: Spec, annotations: dict[str, str] | None = None) -> list[str]:
    """Every violation of the restricted level in a pod's spec and annotations, as
    "<check>: <what>"."""
    found = [f"{check.__name__}: {what}" for check in RESTRICTED for what in check(pod_spec)]
    prefix = "container.apparmor.security.beta.kubernetes.io/"
    found += [
        f"app_armor: annotation {key}={value}"
        for key, value in (annotations or {}).items()
        if key.startswith(prefix)
        and value != "runtime/default"
        and not value.startswith("localhost/")
    ]
    return found
