#include "moeserve/storage/s3_listing.hpp"

#include <charconv>
#include <cstring>

namespace moeserve::storage {

std::string XmlField(std::string_view xml, std::string_view tag) {
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  size_t b = xml.find(open);
  if (b == std::string_view::npos) return "";
  b += open.size();
  size_t e = xml.find(close, b);
  return e == std::string_view::npos ? "" : std::string(xml.substr(b, e - b));
}

std::string XmlUnescape(std::string s) {
  // &amp; last, so "&amp;lt;" becomes "&lt;" and not "<".
  static const std::pair<const char*, const char*> kEntities[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}, {"&#39;", "'"}, {"&amp;", "&"}};
  for (const auto& [from, to] : kEntities) {
    size_t pos = 0;
    while ((pos = s.find(from, pos)) != std::string::npos) {
      s.replace(pos, std::strlen(from), to);
      pos += std::strlen(to);
    }
  }
  return s;
}

Result<S3ListPage> ParseS3ListPage(std::string_view xml, const std::string& bucket, const std::string& prefix) {
  S3ListPage page;
  size_t pos = 0;
  while ((pos = xml.find("<Contents>", pos)) != std::string_view::npos) {
    size_t end = xml.find("</Contents>", pos);
    if (end == std::string_view::npos)
      return Fail(Error::Unavailable("bucket '" + bucket + "', key '" + prefix + "': listing ends mid-entry"));
    std::string_view item = xml.substr(pos, end - pos);
    std::string key = XmlUnescape(XmlField(item, "Key"));
    // ListObjectsV2 with a prefix returns only keys under it; cutting
    // another key by the prefix's length would make up a path.
    if (!key.starts_with(prefix))
      return Fail(Error::InvalidArgument("listing of bucket '" + bucket + "', prefix '" + prefix +
                                         "' returned key '" + key + "', which is not under the prefix"));
    std::string size = XmlField(item, "Size");
    uint64_t bytes = 0;
    auto [ptr, ec] = std::from_chars(size.data(), size.data() + size.size(), bytes);
    if (size.empty() || ec != std::errc() || ptr != size.data() + size.size())
      return Fail(Error::InvalidArgument("listing of bucket '" + bucket + "': key '" + key +
                                         "' has no valid <Size>"));
    if (key.size() > prefix.size() && !key.ends_with("/")) page.objects.push_back({key.substr(prefix.size()), bytes});
    pos = end;
  }
  if (XmlField(xml, "IsTruncated") == "true") page.next_continuation_token = XmlUnescape(XmlField(xml, "NextContinuationToken"));
  return page;
}

}  // namespace moeserve::storage
