// S3's XML bodies, read without an XML library: one ListObjectsV2 page, and
// the <Code>/<Message> of an error body. Kept apart from the transfer code so
// that these parsers of bytes from the network can be tested and fuzzed alone.
//
// Only what moeserve needs is read: <Contents><Key>/<Size>, <IsTruncated>,
// <NextContinuationToken>; the five XML entities and &#39; are decoded.
//
// Thread safety: free functions over values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moeserve/common/status.hpp"
#include "moeserve/storage/object_source.hpp"

namespace moeserve::storage {

// The text between the first <tag> and the </tag> after it; empty when absent.
std::string XmlField(std::string_view xml, std::string_view tag);
std::string XmlUnescape(std::string s);

struct S3ListPage {
  // Keys relative to the prefix; the prefix itself and "folder/" keys skipped.
  std::vector<ObjectInfo> objects;
  // Empty on the last page.
  std::string next_continuation_token;
};

// One ListObjectsV2 response body for `bucket` and `prefix`. Refused: an
// entry without its </Contents> (Unavailable: a cut-off body is worth
// retrying), a key not under the prefix, a <Size> that is not a decimal
// uint64 (InvalidArgument).
Result<S3ListPage> ParseS3ListPage(std::string_view xml, const std::string& bucket, const std::string& prefix);

}  // namespace moeserve::storage
