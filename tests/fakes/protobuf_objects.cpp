#include "protobuf_objects.hpp"

#include <cstdint>
#include <functional>
#include <map>

#include "moeserve/common/base64.hpp"

namespace moeserve::fakes {

using nlohmann::json;

namespace {

// One field of a protobuf message as the wire has it.
struct Field {
  uint32_t number = 0;
  uint32_t wire = 0;     // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  uint64_t varint = 0;   // wire 0
  std::string bytes;     // wire 2
};

// Splits a message into its fields; an error for a truncated or malformed one.
Result<std::vector<Field>> Fields(const std::string& message, const std::string& what) {
  std::vector<Field> out;
  size_t at = 0;
  auto varint = [&](uint64_t& v) -> bool {
    v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= message.size()) return false;
      const auto byte = static_cast<uint8_t>(message[at++]);
      v |= uint64_t(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  };
  while (at < message.size()) {
    uint64_t key = 0;
    if (!varint(key)) return Fail(Error::InvalidArgument(what + ": truncated field key"));
    Field f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<uint32_t>(key & 7);
    if (f.wire == 0) {
      if (!varint(f.varint)) return Fail(Error::InvalidArgument(what + ": truncated varint"));
    } else if (f.wire == 2) {
      uint64_t n = 0;
      if (!varint(n) || n > message.size() - at) return Fail(Error::InvalidArgument(what + ": truncated bytes field"));
      f.bytes = message.substr(at, n);
      at += n;
    } else if (f.wire == 1 || f.wire == 5) {
      const size_t n = f.wire == 1 ? 8 : 4;
      if (n > message.size() - at) return Fail(Error::InvalidArgument(what + ": truncated fixed field"));
      at += n;
    } else {
      return Fail(Error::InvalidArgument(what + ": wire type " + std::to_string(f.wire) + " is not supported"));
    }
    out.push_back(std::move(f));
  }
  return out;
}

Error Unknown(const std::string& what, const Field& f) {
  return Error::InvalidArgument(what + ": field " + std::to_string(f.number) +
                                " is not read by the API double's protobuf decoder; send the object as JSON");
}

// map<string, string|bytes> entries: key = 1, value = 2.
Status MapEntry(const Field& f, const std::string& what, json& into, bool value_is_bytes) {
  MOE_ASSIGN_OR_RETURN(auto entry, Fields(f.bytes, what));
  std::string key, value;
  for (const auto& e : entry) {
    if (e.number == 1 && e.wire == 2) key = e.bytes;
    else if (e.number == 2 && e.wire == 2) value = e.bytes;
    else return Fail(Unknown(what + " entry", e));
  }
  into[key] = value_is_bytes ? Base64Encode(value) : value;
  return Ok();
}

// An empty message or zero value: what Go's generated marshallers write for
// a non-pointer field the client left unset.
// Go's generated marshallers write every non-pointer field, set or not:
// empty strings, zero integers and messages of only those.
bool Empty(const Field& f) {
  if (f.wire == 0) return f.varint == 0;
  if (f.wire != 2) return false;
  if (f.bytes.empty()) return true;
  auto inner = Fields(f.bytes, "");
  if (!inner) return false;
  for (const auto& g : *inner)
    if (!Empty(g)) return false;
  return true;
}

Result<json> ObjectMeta(const std::string& message) {
  const std::string what = "metadata";
  MOE_ASSIGN_OR_RETURN(auto fields, Fields(message, what));
  json meta = json::object();
  for (const auto& f : fields) {
    switch (f.number) {
      // Empty strings are unset (JSON's omitempty).
      case 1: if (!f.bytes.empty()) meta["name"] = f.bytes; break;
      case 2: if (!f.bytes.empty()) meta["generateName"] = f.bytes; break;
      case 3: if (!f.bytes.empty()) meta["namespace"] = f.bytes; break;
      case 11: MOE_TRY(MapEntry(f, "metadata.labels", meta["labels"], false)); break;
      case 12: MOE_TRY(MapEntry(f, "metadata.annotations", meta["annotations"], false)); break;
      case 14: meta["finalizers"].push_back(f.bytes); break;
      // selfLink, uid, resourceVersion, generation, creationTimestamp,
      // deletionTimestamp, deletionGracePeriodSeconds: the server's to set.
      case 4: case 5: case 6: case 7: case 8: case 9: case 10:
        if (!Empty(f)) return Fail(Error::InvalidArgument("metadata field " + std::to_string(f.number) +
                                                           " is set by the server; send it empty or as JSON"));
        break;
      default: return Fail(Unknown(what, f));
    }
  }
  return meta;
}

// A kind's top-level fields after metadata (= 1): number -> reader.
using Reader = std::function<Status(const Field&, json&)>;

Reader StringField(const char* name) {
  return [name](const Field& f, json& o) -> Status {
    if (!f.bytes.empty()) o[name] = f.bytes;
    return Ok();
  };
}
Reader BoolField(const char* name) {
  return [name](const Field& f, json& o) -> Status {
    o[name] = f.varint != 0;
    return Ok();
  };
}
Reader MapField(const char* name, bool bytes) {
  return [name, bytes](const Field& f, json& o) -> Status { return MapEntry(f, name, o[name], bytes); };
}
// A sub-message that clients send empty (Namespace spec and status).
Reader EmptyMessage(const char* name) {
  return [name](const Field& f, json&) -> Status {
    if (!Empty(f))
      return Fail(Error::InvalidArgument(std::string(name) + " is not read by the API double's protobuf decoder; "
                                         "send the object as JSON"));
    return Ok();
  };
}
// A sub-message of string fields: number -> JSON name.
Result<json> StringMessage(const std::string& bytes, const std::string& what, const std::map<uint32_t, const char*>& names) {
  MOE_ASSIGN_OR_RETURN(auto fields, Fields(bytes, what));
  json o = json::object();
  for (const auto& f : fields) {
    auto it = names.find(f.number);
    if (it == names.end() || f.wire != 2) return Fail(Unknown(what, f));
    if (!f.bytes.empty()) o[it->second] = f.bytes;
  }
  return o;
}

// rbac.authorization.k8s.io/v1 PolicyRule: five repeated strings.
Status PolicyRule(const Field& f, json& o) {
  static const std::map<uint32_t, const char*> names = {
      {1, "verbs"}, {2, "apiGroups"}, {3, "resources"}, {4, "resourceNames"}, {5, "nonResourceURLs"}};
  MOE_ASSIGN_OR_RETURN(auto fields, Fields(f.bytes, "rules"));
  json rule = json::object();
  for (const auto& g : fields) {
    auto it = names.find(g.number);
    if (it == names.end() || g.wire != 2) return Fail(Unknown("rules", g));
    rule[it->second].push_back(g.bytes);
  }
  o["rules"].push_back(rule);
  return Ok();
}

Status Subject(const Field& f, json& o) {
  MOE_ASSIGN_OR_RETURN(json s, StringMessage(f.bytes, "subjects", {{1, "kind"}, {2, "apiGroup"}, {3, "name"}, {4, "namespace"}}));
  o["subjects"].push_back(s);
  return Ok();
}

Status RoleRef(const Field& f, json& o) {
  MOE_ASSIGN_OR_RETURN(o["roleRef"], StringMessage(f.bytes, "roleRef", {{1, "apiGroup"}, {2, "kind"}, {3, "name"}}));
  return Ok();
}

struct Kind {
  std::string api_version;
  std::map<uint32_t, Reader> fields;
};

const std::map<std::string, Kind>& Kinds() {
  static const std::map<std::string, Kind> kinds = {
      {"Namespace", {"v1", {{2, EmptyMessage("spec")}, {3, EmptyMessage("status")}}}},
      {"Secret",
       {"v1",
        {{2, MapField("data", true)}, {3, StringField("type")}, {4, MapField("stringData", false)}, {5, BoolField("immutable")}}}},
      {"ConfigMap", {"v1", {{2, MapField("data", false)}, {3, MapField("binaryData", true)}, {4, BoolField("immutable")}}}},
      {"ServiceAccount", {"v1", {{4, BoolField("automountServiceAccountToken")}}}},
      {"RoleBinding", {"rbac.authorization.k8s.io/v1", {{2, Subject}, {3, RoleRef}}}},
      {"ClusterRoleBinding", {"rbac.authorization.k8s.io/v1", {{2, Subject}, {3, RoleRef}}}},
      {"Role", {"rbac.authorization.k8s.io/v1", {{2, PolicyRule}}}},
      {"ClusterRole", {"rbac.authorization.k8s.io/v1", {{2, PolicyRule}, {3, EmptyMessage("aggregationRule")}}}},
  };
  return kinds;
}

}  // namespace

bool IsKubernetesProtobuf(const std::string& content_type) {
  return content_type.rfind(kProtobufContentType, 0) == 0 &&
         (content_type.size() == sizeof(kProtobufContentType) - 1 || content_type[sizeof(kProtobufContentType) - 1] == ';');
}

Result<json> DecodeKubernetesProtobuf(const std::string& body) {
  static const std::string kMagic("k8s\0", 4);
  if (body.compare(0, 4, kMagic) != 0)
    return Fail(Error::InvalidArgument("a protobuf body must start with the bytes \"k8s\\0\""));
  MOE_ASSIGN_OR_RETURN(auto envelope, Fields(body.substr(4), "runtime.Unknown"));
  std::string api_version, kind, raw;
  bool has_raw = false;
  for (const auto& f : envelope) {
    if (f.number == 1 && f.wire == 2) {
      MOE_ASSIGN_OR_RETURN(json type, StringMessage(f.bytes, "typeMeta", {{1, "apiVersion"}, {2, "kind"}}));
      api_version = type.value("apiVersion", "");
      kind = type.value("kind", "");
    } else if (f.number == 2 && f.wire == 2) {
      raw = f.bytes;
      has_raw = true;
    } else if ((f.number == 3 || f.number == 4) && f.wire == 2) {
      if (!f.bytes.empty()) return Fail(Error::InvalidArgument("runtime.Unknown: contentEncoding/contentType are not supported"));
    } else {
      return Fail(Unknown("runtime.Unknown", f));
    }
  }
  if (!has_raw) return Fail(Error::InvalidArgument("runtime.Unknown: no raw object"));
  auto it = Kinds().find(kind);
  if (it == Kinds().end() || it->second.api_version != api_version)
    return Fail(Error::InvalidArgument("the API double decodes protobuf for Namespace, Secret, ConfigMap, "
                                       "ServiceAccount, Role, ClusterRole, RoleBinding and ClusterRoleBinding only, "
                                       "not " + api_version + " " + kind + "; send it as JSON"));
  json object = {{"apiVersion", api_version}, {"kind", kind}};
  MOE_ASSIGN_OR_RETURN(auto fields, Fields(raw, kind));
  for (const auto& f : fields) {
    if (f.number == 1 && f.wire == 2) {
      MOE_ASSIGN_OR_RETURN(object["metadata"], ObjectMeta(f.bytes));
      continue;
    }
    auto reader = it->second.fields.find(f.number);
    if (reader == it->second.fields.end()) return Fail(Unknown(kind, f));
    MOE_TRY(reader->second(f, object));
  }
  if (!object.contains("metadata")) object["metadata"] = json::object();
  // kube-apiserver's defaulting for a Secret created without a type.
  if (kind == "Secret" && !object.contains("type")) object["type"] = "Opaque";
  return object;
}

}  // namespace moeserve::fakes
