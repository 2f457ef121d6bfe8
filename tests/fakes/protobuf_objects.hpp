// Kubernetes protobuf request bodies, decoded to the JSON the API double
// stores, for the built-in kinds kubectl sends as protobuf.
//
// kubectl's typed commands (`kubectl create namespace`, `create secret`,
// `create configmap`, `create serviceaccount`, `create role`, `create
// clusterrole`, `create rolebinding`, `create clusterrolebinding`) encode
// their object as `application/vnd.kubernetes.protobuf`: the magic bytes
// "k8s\0", then a runtime.Unknown message (typeMeta, raw, contentEncoding,
// contentType) whose raw bytes are the object's generated protobuf message.
// client-go does not fall back to JSON when a server answers 415 to a
// protobuf body (it does so only for CBOR), so a server that takes these
// commands has to read protobuf.
//
// Decoded: Namespace, Secret, ConfigMap, ServiceAccount, Role, ClusterRole,
// RoleBinding and ClusterRoleBinding,
// with the ObjectMeta fields a client sets (name, generateName, namespace,
// labels, annotations, finalizers); server-owned ObjectMeta fields a client
// sends empty are skipped. Anything else (another kind, a field this reader
// does not know, a non-empty server-owned field) is an error naming it,
// which the server answers with 415 UnsupportedMediaType: never a guess.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "moeserve/common/status.hpp"

namespace moeserve::fakes {

inline constexpr char kProtobufContentType[] = "application/vnd.kubernetes.protobuf";

// True when the Content-Type names Kubernetes protobuf (parameters ignored).
bool IsKubernetesProtobuf(const std::string& content_type);

// The object of a protobuf request body, as JSON with apiVersion and kind.
Result<nlohmann::json> DecodeKubernetesProtobuf(const std::string& body);

}  // namespace moeserve::fakes
