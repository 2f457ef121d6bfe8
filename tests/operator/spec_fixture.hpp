// The smallest MoEDeployment spec the operator accepts (an image, a model, an
// endpoint's key secret) with a test's own blocks merged over it, and the
// object metadata the desired-state builders take: for the tests that render
// StatefulSets and ConfigMaps from one block of the spec.
#pragma once

#include <nlohmann/json.hpp>

namespace moeserve::op::spec_fixture {

inline nlohmann::json Spec(nlohmann::json extra) {
  nlohmann::json spec = {{"image", "moeserve/moe-daemon:0.1.0"},
                         {"model", {{"uri", "s3://models/tiny/"}, {"revision", "r1"}}},
                         {"endpoint", {{"apiKeys", {{"secretRef", {{"name", "keys"}}}}}}}};
  spec.update(extra);
  return spec;
}

inline const nlohmann::json kMeta = {{"apiVersion", "moeserve.io/v1alpha1"},
                                     {"kind", "MoEDeployment"},
                                     {"metadata", {{"name", "ultra"}, {"namespace", "team-a"}, {"uid", "u-1"}}}};

}  // namespace moeserve::op::spec_fixture
