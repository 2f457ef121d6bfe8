// Standard base64 (RFC 4648, with padding), as Kubernetes Secrets and
// kubeconfig *-data fields use it.
#pragma once

#include <string>
#include <string_view>

namespace moeserve {

std::string Base64Encode(std::string_view in);
// Characters outside the alphabet (padding, line breaks) are skipped.
std::string Base64Decode(std::string_view in);

}  // namespace moeserve
