// What the chart tests share: a renderer for charts/moeserve (no helm binary
// here) and RBAC rule evaluation.
//
// The renderer knows only what the chart's templates may use:
// `{{ .Values.a.b }}` (a scalar from the values; a missing key or a map is an
// error, never an empty string), `{{ .Release.Namespace }}`,
// `{{ .Release.Name }}`, `{{ .Chart.Version }}`, `{{ .Chart.AppVersion }}`,
// whole-line `{{- if .Values.x }}`, `{{- else }}`, `{{- end }}` (the value a
// boolean, or a string or list, true when not empty, as helm has it), and
// whole-line `{{- range .Values.list }}` ... `{{- end }}` over a list of
// scalars, inside which only `{{ . }}` and `{{ $.Release.Namespace }}` (and
// the other `$.` forms) are known. Anything else between braces is an
// error, so a template that helm would render differently fails here instead.
//
// RuleAllows is RBAC's rule matching (apiGroups, resources with
// "resource/subresource", verbs, resourceNames, "*"). InstallChart applies a
// rendered chart with kubectl as `helm install` would; ChartArguments and
// OperatorProcess run moe-operator with the rendered Deployment's arguments.
//
// Thread safety: plain functions over values.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fake_apiserver.hpp"
#include "moeserve/common/status.hpp"
#include "operator_test_util.hpp"
#include "yaml_json.hpp"

namespace moeserve::op::testing {

inline std::filesystem::path ChartDir() { return std::filesystem::path(SourceDir()) / "charts" / "moeserve"; }

inline std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Release {
  std::string name = "moeserve";
  std::string ns = "moeserve-system";
};

// The scalar at a dotted path ("operator.image") of the values.
inline Result<nlohmann::json> ValueAt(const nlohmann::json& values, const std::string& dotted) {
  const nlohmann::json* node = &values;
  std::stringstream ss(dotted);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (!node->is_object() || !node->contains(part)) return Fail(Error::NotFound("no value ." + dotted));
    node = &(*node)[part];
  }
  return *node;
}

// Sets a dotted path, as `helm install --set a.b=v` would.
inline void SetValue(nlohmann::json& values, const std::string& dotted, nlohmann::json v) {
  nlohmann::json* node = &values;
  std::stringstream ss(dotted);
  std::string part;
  while (std::getline(ss, part, '.')) node = &(*node)[part];
  *node = std::move(v);
}

inline Result<nlohmann::json> LoadValues() {
  MOE_ASSIGN_OR_RETURN(auto docs, fakes::LoadYamlFile((ChartDir() / "values.yaml").string()));
  if (docs.size() != 1 || !docs[0].is_object()) return Fail(Error::InvalidArgument("values.yaml: not one mapping"));
  return docs[0];
}

// Helm's truth of a value an `if` tests: a boolean, or a string or list
// (true when not empty). Anything else is an error here, so that no value
// is tested by accident.
inline Result<bool> Truth(const nlohmann::json& v, const std::string& where) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();  // json::empty() is false for any string
  if (v.is_array()) return !v.empty();
  return Fail(Error::InvalidArgument(where + "if on a value that is not a boolean, a string or a list"));
}

inline Result<std::string> RenderTemplate(const std::string& text, const nlohmann::json& values, const Release& release,
                                          const nlohmann::json& chart, std::vector<std::string>* used = nullptr,
                                          const nlohmann::json* dot = nullptr) {
  static const std::regex kControl(R"(^\s*\{\{-?\s*(if\s+\.Values\.([A-Za-z0-9_.]+)|else|end)\s*-?\}\}\s*$)");
  static const std::regex kRange(R"(^\s*\{\{-?\s*range\s+\.Values\.([A-Za-z0-9_.]+)\s*-?\}\}\s*$)");
  static const std::regex kOpens(R"(^\s*\{\{-?\s*(if|range)\s.*\}\}\s*$)");
  static const std::regex kEnds(R"(^\s*\{\{-?\s*end\s*-?\}\}\s*$)");
  static const std::regex kExpr(R"(\{\{-?\s*([^}]*?)\s*-?\}\})");
  std::string out;
  std::vector<bool> emitting;  // one per open if: whether its current branch is emitted
  auto active = [&] {
    for (bool e : emitting)
      if (!e) return false;
    return true;
  };
  std::stringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    const std::string where = "line " + std::to_string(number) + ": ";
    std::smatch m;
    if (std::regex_match(line, m, kRange)) {
      // `{{- range .Values.list }}` ... `{{- end }}`: the body once per
      // element, where `{{ . }}` is the element and `{{ $.Release.* }}` the
      // release (helm's `.` is the element inside).
      if (dot) return Fail(Error::InvalidArgument(where + "range inside range"));
      const std::string key = m[1].str();
      std::string body;
      int depth = 1;
      while (depth > 0 && std::getline(lines, line)) {
        ++number;
        if (std::regex_match(line, kOpens)) depth++;
        else if (std::regex_match(line, kEnds)) depth--;
        if (depth > 0) body += line + "\n";
      }
      if (depth > 0) return Fail(Error::InvalidArgument(where + "range without end"));
      MOE_ASSIGN_OR_RETURN(auto list, ValueAt(values, key));
      if (!list.is_array()) return Fail(Error::InvalidArgument(where + "range over a value that is not a list"));
      if (used) used->push_back(key);
      if (!active()) continue;
      for (const auto& element : list) {
        if (element.is_object() || element.is_array() || element.is_null())
          return Fail(Error::InvalidArgument(where + "range over a list of other than scalars"));
        MOE_ASSIGN_OR_RETURN(auto rendered, RenderTemplate(body, values, release, chart, used, &element));
        out += rendered;
      }
      continue;
    }
    if (std::regex_match(line, m, kControl)) {
      const std::string what = m[1].str();
      if (what == "end") {
        if (emitting.empty()) return Fail(Error::InvalidArgument(where + "end without if"));
        emitting.pop_back();
      } else if (what == "else") {
        if (emitting.empty()) return Fail(Error::InvalidArgument(where + "else without if"));
        emitting.back() = !emitting.back();
      } else {
        if (dot) return Fail(Error::InvalidArgument(where + ".Values inside range (helm's dot is the element there)"));
        MOE_ASSIGN_OR_RETURN(auto v, ValueAt(values, m[2].str()));
        MOE_ASSIGN_OR_RETURN(bool on, Truth(v, where));
        if (used) used->push_back(m[2].str());
        emitting.push_back(on);
      }
      continue;
    }
    std::string rendered;
    auto begin = line.cbegin();
    for (std::sregex_iterator it(line.begin(), line.end(), kExpr), end; it != end; ++it) {
      rendered.append(begin, line.cbegin() + it->position());
      begin = line.cbegin() + it->position() + it->length();
      std::string expr = (*it)[1].str();
      nlohmann::json v;
      if (dot) {
        // Inside range: the element, or the root through `$`.
        if (expr == ".") {
          v = *dot;
          rendered += v.is_string() ? v.get<std::string>() : v.dump();
          continue;
        }
        if (expr.rfind("$.", 0) != 0)
          return Fail(Error::InvalidArgument(where + "{{ " + expr + " }} inside range (write $" + expr + ")"));
        expr = expr.substr(1);
      } else if (expr.rfind("$.", 0) == 0) {
        expr = expr.substr(1);
      }
      if (expr == ".Release.Namespace") v = release.ns;
      else if (expr == ".Release.Name") v = release.name;
      else if (expr == ".Chart.Version") v = chart.value("version", "");
      else if (expr == ".Chart.AppVersion") v = chart.value("appVersion", "");
      else if (expr.rfind(".Values.", 0) == 0 && expr.find_first_of(" |()") == std::string::npos) {
        auto found = ValueAt(values, expr.substr(8));
        if (!found) return Fail(Error::NotFound(where + found.error().message()));
        if (used) used->push_back(expr.substr(8));
        v = *found;
      } else {
        return Fail(Error::InvalidArgument(where + "unsupported template expression {{ " + expr + " }}"));
      }
      if (v.is_object() || v.is_array() || v.is_null())
        return Fail(Error::InvalidArgument(where + expr + " is not a scalar"));
      rendered += v.is_string() ? v.get<std::string>() : v.dump();
    }
    rendered.append(begin, line.cend());
    if (rendered.find("{{") != std::string::npos || rendered.find("}}") != std::string::npos)
      return Fail(Error::InvalidArgument(where + "unbalanced braces"));
    if (active()) out += rendered + "\n";
  }
  if (!emitting.empty()) return Fail(Error::InvalidArgument("if without end"));
  return out;
}

struct RenderedChart {
  std::map<std::string, std::string> files;  // template file name -> rendered text
  std::vector<nlohmann::json> objects;       // every document, in file order
  std::vector<std::string> used_values;      // dotted keys the templates read
};

inline Result<RenderedChart> RenderChart(const nlohmann::json& values, const Release& release = {}) {
  MOE_ASSIGN_OR_RETURN(auto chart_docs, fakes::LoadYamlFile((ChartDir() / "Chart.yaml").string()));
  if (chart_docs.empty()) return Fail(Error::InvalidArgument("Chart.yaml is empty"));
  RenderedChart out;
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(ChartDir() / "templates"))
    if (entry.path().extension() == ".yaml") paths.push_back(entry.path());
  std::sort(paths.begin(), paths.end());
  for (const auto& path : paths) {
    auto text = RenderTemplate(ReadText(path), values, release, chart_docs[0], &out.used_values);
    if (!text) return Fail(Error::InvalidArgument(path.filename().string() + ": " + text.error().message()));
    auto docs = fakes::YamlDocumentsToJson(*text);
    if (!docs) return Fail(Error::InvalidArgument(path.filename().string() + " rendered: " + docs.error().message()));
    for (auto& d : *docs)
      if (d.is_object()) out.objects.push_back(d);
    out.files[path.filename().string()] = *text;
  }
  return out;
}

// What `helm install -n <ns>` does, with the real kubectl against the API
// double: the chart's crds/ first, then every rendered object into the
// release namespace (which must exist), or into the namespace it names
// itself (the RoleBindings of operator.watchNamespaces). The output of the
// failing step, or "".
inline std::string InstallChart(const Kubectl& kubectl, const RenderedChart& chart, const Release& release) {
  auto crds = kubectl("apply -f " + (ChartDir() / "crds").string());
  if (crds.rc != 0) return "kubectl apply crds: " + crds.output;
  std::map<std::string, std::string> by_namespace;  // documents (JSON is YAML) per namespace
  for (const auto& o : chart.objects) {
    const nlohmann::json meta = o.value("metadata", nlohmann::json::object());
    const std::string ns = meta.value("namespace", nlohmann::json("")).is_string() ? meta.value("namespace", "") : "";
    by_namespace[ns.empty() ? release.ns : ns] += "---\n" + o.dump(2) + "\n";
  }
  for (const auto& [ns, documents] : by_namespace) {
    const auto path = std::filesystem::temp_directory_path() /
                      ("moe-chart-" + std::to_string(getpid()) + "-" + release.ns + "-" + ns + ".yaml");
    std::ofstream(path) << documents;
    auto applied = kubectl("apply -n " + ns + " -f " + path.string());
    std::filesystem::remove(path);
    if (applied.rc != 0) return "kubectl apply templates (" + ns + "): " + applied.output;
  }
  return "";
}

// The rendered object of a kind and name, or null.
inline nlohmann::json FindObject(const std::vector<nlohmann::json>& objects, const std::string& kind,
                                 const std::string& name) {
  for (const auto& o : objects)
    if (o.value("kind", "") == kind && o["metadata"].value("name", "") == name) return o;
  return nullptr;
}

inline bool Lists(const nlohmann::json& list, const std::string& want) {
  if (!list.is_array()) return false;
  for (const auto& e : list)
    if (e == want || e == "*") return true;
  return false;
}

// Whether one PolicyRule allows a request.
inline bool RuleAllows(const nlohmann::json& rule, const std::string& verb, const std::string& group,
                       const std::string& resource, const std::string& subresource, const std::string& name) {
  if (!Lists(rule.value("verbs", nlohmann::json::array()), verb)) return false;
  if (!Lists(rule.value("apiGroups", nlohmann::json::array()), group)) return false;
  const std::string qualified = subresource.empty() ? resource : resource + "/" + subresource;
  if (!Lists(rule.value("resources", nlohmann::json::array()), qualified)) return false;
  const auto names = rule.value("resourceNames", nlohmann::json::array());
  if (!names.empty() && (name.empty() || !Lists(names, name))) return false;
  return true;
}

inline bool RoleAllows(const nlohmann::json& role, const std::string& verb, const std::string& group,
                       const std::string& resource, const std::string& subresource = "", const std::string& name = "") {
  for (const auto& rule : role.value("rules", nlohmann::json::array()))
    if (RuleAllows(rule, verb, group, resource, subresource, name)) return true;
  return false;
}

// A role the chart grants moe-operator's ServiceAccount, and where: through
// a ClusterRoleBinding (ns "", every namespace and cluster-scoped objects)
// or a RoleBinding (its namespace only; a Role, or a ClusterRole bound there).
struct BoundRole {
  nlohmann::json role;
  std::string ns;
  std::string label;  // "ClusterRole x", "Role x in ns", "ClusterRole x in ns"
};

inline std::vector<BoundRole> OperatorRoles(const RenderedChart& chart, const std::string& release_ns,
                                            const std::string& service_account = "moeserve-operator") {
  std::vector<BoundRole> out;
  auto namespace_of = [&](const nlohmann::json& o) {
    const std::string ns = o["metadata"].value("namespace", nlohmann::json("")).is_string() ? o["metadata"].value("namespace", "") : "";
    return ns.empty() ? release_ns : ns;
  };
  for (const auto& b : chart.objects) {
    const std::string kind = b.value("kind", "");
    if (kind != "ClusterRoleBinding" && kind != "RoleBinding") continue;
    bool ours = false;
    for (const auto& subject : b.value("subjects", nlohmann::json::array()))
      ours = ours || (subject.value("kind", "") == "ServiceAccount" && subject.value("name", "") == service_account &&
                      subject.value("namespace", "") == release_ns);
    if (!ours) continue;
    const std::string ref_kind = b["roleRef"].value("kind", ""), ref_name = b["roleRef"].value("name", "");
    nlohmann::json role = FindObject(chart.objects, ref_kind, ref_name);
    EXPECT_TRUE(role.is_object()) << kind << " " << b["metadata"].value("name", "") << " binds a missing " << ref_kind
                                  << " " << ref_name;
    if (!role.is_object()) continue;
    if (kind == "ClusterRoleBinding") {
      out.push_back({role, "", "ClusterRole " + ref_name});
    } else {
      const std::string ns = namespace_of(b);
      if (ref_kind == "Role" && namespace_of(role) != ns) continue;  // a Role binds only in its own namespace
      out.push_back({role, ns, ref_kind + " " + ref_name + " in " + ns});
    }
  }
  return out;
}

// A port nothing listens on now, for the webhook (tests never use fixed ports).
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

// The operator container's arguments from the rendered Deployment, with
// $(VAR) expanded as the kubelet does from the container's env (fieldRefs
// resolved to the given namespace and pod name); plain env values are
// exported for the process.
inline std::vector<std::string> ChartArguments(const RenderedChart& chart, const std::string& pod_namespace,
                                               const std::string& pod_name) {
  const json deployment = FindObject(chart.objects, "Deployment", "moeserve-operator");
  EXPECT_TRUE(deployment.is_object()) << "no Deployment moeserve-operator in the chart";
  if (!deployment.is_object()) return {};
  const json container = deployment["spec"]["template"]["spec"]["containers"][0];
  std::map<std::string, std::string> env;
  for (const auto& e : container.value("env", json::array())) {
    const std::string name = e.value("name", "");
    if (e.contains("value")) {
      env[name] = e["value"].is_string() ? e["value"].get<std::string>() : e["value"].dump();
      setenv(name.c_str(), env[name].c_str(), 1);
      continue;
    }
    const std::string field = e["valueFrom"].value("fieldRef", json::object()).value("fieldPath", "");
    if (field == "metadata.namespace") env[name] = pod_namespace;
    else if (field == "metadata.name") env[name] = pod_name;
    else ADD_FAILURE() << "env " << name << ": the test does not know how to fill " << e.dump();
  }
  std::vector<std::string> args;
  for (const auto& a : container.value("args", json::array())) {
    std::string arg = a.get<std::string>();
    for (const auto& [k, v] : env)
      for (size_t at; (at = arg.find("$(" + k + ")")) != std::string::npos;) arg.replace(at, k.size() + 3, v);
    args.push_back(arg);
  }
  return args;
}

// moe-operator (this build's) as a child process; killed if still running
// when destroyed.
class OperatorProcess {
 public:
  explicit OperatorProcess(std::vector<std::string> args) {
    args.insert(args.begin(), OperatorBinary());
    pid_ = Spawn(args);
  }
  ~OperatorProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool running() const { return pid_ > 0; }
  // The exit status if it has ended (it is then reaped), else nullopt.
  std::optional<int> Exited() {
    int status = 0;
    if (pid_ <= 0 || waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // SIGTERM, and the exit status (-1 when it had to be killed).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + 15s;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;  // the destructor kills it
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace moeserve::op::testing
