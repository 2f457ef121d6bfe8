// S3 ListObjectsV2 pages (ParseS3ListPage) and error bodies (XmlField,
// XmlUnescape): bytes from a bucket we do not control. Input: the prefix on
// the first line, the body after it. Every listed object must be a file
// strictly under the prefix, named relative to it.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "moeserve/storage/s3_listing.hpp"

using namespace moeserve;
using namespace moeserve::storage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const std::string prefix(newline == std::string_view::npos ? std::string_view() : input.substr(0, newline));
  const std::string_view body = newline == std::string_view::npos ? input : input.substr(newline + 1);

  (void)XmlUnescape(XmlField(body, "Message"));
  auto page = ParseS3ListPage(body, "bucket", prefix);
  if (!page) {
    FUZZ_CHECK(!page.error().message().empty(), "a refusal says why");
    return 0;
  }
  for (const ObjectInfo& o : page->objects) {
    FUZZ_CHECK(!o.key.empty() && !o.key.ends_with("/"), "listed a folder or the prefix itself: '" + o.key + "'");
    FUZZ_CHECK(body.find("<Contents>") != std::string_view::npos, "an object without an entry");
  }
  return 0;
}
