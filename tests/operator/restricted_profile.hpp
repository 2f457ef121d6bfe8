// The Pod Security Standards' `restricted` profile (which includes
// `baseline`), as kubernetes.io/docs/concepts/security/pod-security-standards
// lists its controls, checked against a pod spec. Each violation names the
// control and the field, as the admission controller's message would.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeserve::op::testing {

inline std::vector<std::string> RestrictedViolations(const nlohmann::json& pod) {
  using nlohmann::json;
  std::vector<std::string> out;
  auto add = [&](const std::string& control, const std::string& field) { out.push_back(control + ": " + field); };
  const json psc = pod.value("securityContext", json::object());
  auto is_true = [](const json& o, const char* k) { return o.is_object() && o.contains(k) && o[k] == true; };

  // Baseline: host namespaces.
  for (const char* k : {"hostNetwork", "hostPID", "hostIPC"})
    if (is_true(pod, k)) add("host namespaces", std::string("spec.") + k);
  // Baseline: HostProcess.
  if (is_true(psc.value("windowsOptions", json::object()), "hostProcess"))
    add("HostProcess", "spec.securityContext.windowsOptions.hostProcess");
  // Baseline: sysctls, only the safe set.
  static const std::set<std::string> kSafeSysctls = {
      "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
      "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
      "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
      "net.ipv4.tcp_keepalive_probes"};
  for (const auto& s : psc.value("sysctls", json::array()))
    if (!kSafeSysctls.count(s.value("name", ""))) add("sysctls", "spec.securityContext.sysctls " + s.value("name", ""));
  // Baseline: SELinux, AppArmor at pod level.
  auto check_selinux = [&](const json& sc, const std::string& where) {
    const json se = sc.value("seLinuxOptions", json::object());
    static const std::set<std::string> kTypes = {"", "container_t", "container_init_t", "container_kvm_t",
                                                 "container_engine_t"};
    if (!kTypes.count(se.value("type", ""))) add("SELinux", where + ".seLinuxOptions.type");
    if (se.contains("user") || se.contains("role")) add("SELinux", where + ".seLinuxOptions.user/role");
    const json aa = sc.value("appArmorProfile", json::object());
    if (aa.value("type", "RuntimeDefault") == "Unconfined") add("AppArmor", where + ".appArmorProfile");
  };
  check_selinux(psc, "spec.securityContext");
  // Restricted: volume types.
  static const std::set<std::string> kVolumeKinds = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                                     "persistentVolumeClaim", "projected", "secret"};
  for (const auto& v : pod.value("volumes", json::array())) {
    for (const auto& [k, _] : v.items()) {
      if (k == "name") continue;
      if (k == "hostPath") add("hostPath volumes", "spec.volumes[" + v.value("name", "") + "].hostPath");
      if (!kVolumeKinds.count(k)) add("volume types", "spec.volumes[" + v.value("name", "") + "]." + k);
    }
  }
  // Restricted: pod-level non-root, seccomp.
  const bool pod_non_root = is_true(psc, "runAsNonRoot");
  if (psc.contains("runAsUser") && psc["runAsUser"] == 0) add("running as non-root user", "spec.securityContext.runAsUser");
  const std::string pod_seccomp = psc.value("seccompProfile", json::object()).value("type", "");
  if (pod_seccomp == "Unconfined") add("seccomp", "spec.securityContext.seccompProfile.type");

  std::vector<std::pair<std::string, json>> containers;
  for (const char* list : {"initContainers", "containers", "ephemeralContainers"})
    for (const auto& c : pod.value(list, json::array())) containers.push_back({std::string(list) + "[" + c.value("name", "") + "]", c});
  if (pod.value("containers", json::array()).empty()) add("pod", "spec.containers is empty");
  static const std::set<std::string> kBaselineCaps = {"AUDIT_WRITE", "CHOWN",     "DAC_OVERRIDE", "FOWNER",
                                                      "FSETID",      "KILL",      "MKNOD",        "NET_BIND_SERVICE",
                                                      "SETFCAP",     "SETGID",    "SETPCAP",      "SETUID",
                                                      "SYS_CHROOT"};
  for (const auto& [where, c] : containers) {
    const json sc = c.value("securityContext", json::object());
    // Baseline.
    if (is_true(sc, "privileged")) add("privileged containers", where + ".securityContext.privileged");
    if (is_true(sc.value("windowsOptions", json::object()), "hostProcess")) add("HostProcess", where);
    for (const auto& p : c.value("ports", json::array()))
      if (p.value("hostPort", 0) != 0) add("host ports", where + ".ports.hostPort");
    if (sc.value("procMount", "Default") != "Default") add("/proc mount type", where + ".securityContext.procMount");
    check_selinux(sc, where + ".securityContext");
    // Restricted.
    if (!sc.contains("allowPrivilegeEscalation") || sc["allowPrivilegeEscalation"] != false)
      add("privilege escalation", where + ".securityContext.allowPrivilegeEscalation must be false");
    if (sc.contains("runAsNonRoot") && sc["runAsNonRoot"] == false)
      add("running as non-root", where + ".securityContext.runAsNonRoot=false");
    if (!pod_non_root && !is_true(sc, "runAsNonRoot"))
      add("running as non-root", where + ": runAsNonRoot must be true (pod or container)");
    if (sc.contains("runAsUser") && sc["runAsUser"] == 0) add("running as non-root user", where + ".securityContext.runAsUser");
    const std::string seccomp = sc.value("seccompProfile", json::object()).value("type", pod_seccomp);
    if (seccomp != "RuntimeDefault" && seccomp != "Localhost")
      add("seccomp", where + ": seccompProfile.type must be RuntimeDefault or Localhost");
    const json caps = sc.value("capabilities", json::object());
    bool drops_all = false;
    for (const auto& d : caps.value("drop", json::array())) drops_all = drops_all || d == "ALL";
    if (!drops_all) add("capabilities", where + ".securityContext.capabilities.drop must include ALL");
    for (const auto& a : caps.value("add", json::array())) {
      if (a != "NET_BIND_SERVICE") add("capabilities", where + ".securityContext.capabilities.add " + a.dump());
      if (!kBaselineCaps.count(a.get<std::string>())) add("capabilities (baseline)", where + " adds " + a.dump());
    }
  }
  return out;
}

}  // namespace moeserve::op::testing
